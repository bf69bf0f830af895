"""Resident memory of one large embedding table, float32 vs split bf16 (``--split_embedding_tables``).

Each form is built in its own process (``--form=float32|split``), under ``mixed_bfloat16``, as one
model-parallel table of ``--rows`` x ``--dim`` in a one-process :class:`DistributedEmbedding`; the
process looks up one batch (so the tables are really materialised), drops what Python holds of the
initial values, and prints one JSON line: the bytes of the table variables (both halves of a split
table), the process's resident set size (``VmRSS``) before building and after the lookup, the same
after ``malloc_trim(0)`` (``rss_trimmed``: glibc keeps some of the freed per-block temporaries of the
build in its arenas, 0 to 70 MB from run to run; trimmed, what stays is what the process holds), and
its peak (``VmHWM``, reset just before building through ``/proc/self/clear_refs``): what building the
table needs on top of holding it.

    python benchmarks/split_table_memory.py --rows=2000000 --dim=64
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rss_bytes(field: str = "VmRSS") -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # resets VmHWM to the current VmRSS (Linux >= 4.0)


def trim_malloc_arenas() -> None:
    """Returns glibc's free arena memory to the system (a no-op where libc has no ``malloc_trim``)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    if hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def measure(form: str, rows: int, dim: int) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    import tensorflow as tf

    from tf_dlrm.embedding import DistributedEmbedding, FeatureConfig, Placement, TableConfig
    from tf_dlrm.embedding.split_tables import table_bytes

    def one_table_layer(name: str, table_rows: int):
        # One table, its one feature named like it; stacked: one tensor, as the model's lookup gives.
        storage = "split_bfloat16" if form == "split" else "float32"
        table = TableConfig(name, table_rows, dim, placement=Placement("table_wise", storage=storage))
        return DistributedEmbedding([FeatureConfig(name, table)], seed=1)

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    ids = tf.constant(np.random.default_rng(0).integers(0, rows, 4096), tf.int32)
    tf.reduce_sum(tf.gather(tf.zeros([8, dim]), [0]))  # TensorFlow's own start-up allocations first
    # A small layer of the same form first: what the first lookup loads once (the kernel library, the
    # ops' thread pools and caches, tens of MB, and not the same for both forms) is then in the baseline.
    warm = one_table_layer("small", 4096)
    float(tf.reduce_sum(tf.cast(warm({"small": ids % 4096}, stacked=True), tf.float32)))
    gc.collect()
    before = rss_bytes()
    reset_peak_rss()
    layer = one_table_layer("big", rows)
    pooled = layer({"big": ids}, stacked=True)
    float(tf.reduce_sum(tf.cast(pooled, tf.float32)))
    peak = rss_bytes("VmHWM")
    gc.collect()
    after = rss_bytes()
    trim_malloc_arenas()
    trimmed = rss_bytes()
    variables = [v for v in layer.weights if v.trainable]
    return {"benchmark": "split_table_memory", "form": form, "rows": rows, "dim": dim,
            "variables": {v.path: str(v.dtype) for v in layer.weights},
            "table_bytes": table_bytes(variables), "float32_bytes": rows * dim * 4,
            "rss_before": before, "rss_after": after, "rss_growth": after - before,
            "rss_trimmed": trimmed, "rss_growth_trimmed": trimmed - before,
            "rss_peak": peak, "peak_growth": peak - before}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--form", choices=["float32", "split"], default=None, help="measure one form in this process")
    args = parser.parse_args()
    if args.form:
        print(json.dumps(measure(args.form, args.rows, args.dim)), flush=True)
        return
    for form in ("float32", "split"):
        completed = subprocess.run([sys.executable, __file__, f"--form={form}", f"--rows={args.rows}", f"--dim={args.dim}"],
                                   capture_output=True, text=True, check=True)
        print(completed.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
