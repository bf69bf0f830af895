"""Horovod's coordination cycle (``HOROVOD_CYCLE_TIME``) for a run: chosen before ``hvd.init``.

Every cycle (Horovod's default is short) each rank's Horovod background thread wakes and coordinates
with the others over Gloo, whether or not a collective is waiting. Ranks that share a machine's cores
pay for those wake-ups in compute, so a long step gains from a longer cycle (benchmarks/results/performance.md, "Where a -np 2
step's time goes", has the measurements). A longer cycle delays each collective by up to one cycle,
which a step of a tiny model feels, and a step of seconds does not.

So ``auto`` sets :data:`LONG_STEP_CYCLE_MS` when a rank's MLPs do at least
:data:`LONG_STEP_MACS` multiply-adds forward per step (the dense stacks' widths times the local
batch: a proxy for a step long enough), and leaves Horovod's default otherwise. A cycle set in the
environment (``HOROVOD_CYCLE_TIME``, or ``horovodrun --cycle-time-ms``) is never changed.
Pure Python: no TensorFlow or Horovod import.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping, Sequence

from tf_dlrm.cli.model_config import parse_positive_or

ENV = "HOROVOD_CYCLE_TIME"
LONG_STEP_MACS = 10_000_000
LONG_STEP_CYCLE_MS = 10.0


def parse_cycle_time(text: str) -> float | None:
    """``--horovod_cycle_time_ms``: ``auto`` (None) or milliseconds > 0; raises naming the flag."""
    return parse_positive_or(text, "auto", "--horovod_cycle_time_ms", "milliseconds")


def dense_macs_per_rank(bottom_mlp_dims: Sequence[int], top_mlp_dims: Sequence[int], global_batch_size: int,
                        world_size: int) -> int:
    """Forward multiply-adds of the MLPs' hidden layers on one rank's samples (inputs' widths unknown here)."""
    per_sample = sum(a * b for dims in (bottom_mlp_dims, top_mlp_dims) for a, b in zip(dims, dims[1:]))
    return per_sample * max(1, global_batch_size // max(1, world_size))


def choose(flag_ms: float | None, environ: MutableMapping[str, str], bottom_mlp_dims, top_mlp_dims,
           global_batch_size: int, world_size: int) -> tuple[float | None, str]:
    """``(milliseconds to set or None, why)``."""
    if environ.get(ENV):
        return None, f"{ENV}={environ[ENV]} from the environment"
    if flag_ms is not None:
        return flag_ms, "--horovod_cycle_time_ms"
    macs = dense_macs_per_rank(bottom_mlp_dims, top_mlp_dims, global_batch_size, world_size)
    if macs >= LONG_STEP_MACS:
        return LONG_STEP_CYCLE_MS, f"auto: {macs:,} MLP multiply-adds per rank and step >= {LONG_STEP_MACS:,}"
    return None, f"auto: {macs:,} MLP multiply-adds per rank and step < {LONG_STEP_MACS:,}, Horovod's default"


def apply(flag_ms: float | None, bottom_mlp_dims, top_mlp_dims, global_batch_size: int, world_size: int,
          environ: MutableMapping[str, str] | None = None) -> str:
    """Sets ``HOROVOD_CYCLE_TIME`` in ``environ`` (this process's) when :func:`choose` says so; returns
    a line for the log. Call before ``hvd.init``."""
    environ = os.environ if environ is None else environ
    milliseconds, why = choose(flag_ms, environ, bottom_mlp_dims, top_mlp_dims, global_batch_size, world_size)
    if milliseconds is not None:
        environ[ENV] = f"{milliseconds:g}"
    current = environ.get(ENV)
    return f"horovod cycle time: {current + ' ms' if current else '1 ms (Horovod default)'} ({why})"
