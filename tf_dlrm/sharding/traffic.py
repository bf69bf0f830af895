"""Bytes each rank moves per training step (pure Python: no TensorFlow, no Horovod).

Two collectives carry a DLRM step's traffic:

- the embedding **alltoall**: rank r sends every other rank ``k`` a ``[local batch, W_r]`` block of
  pooled embeddings (``W_r`` its send width) and receives ``[local batch, W_s]`` from every source
  ``s``; the backward alltoall moves the gradients of the same blocks the other way, so what a rank
  sent forward it receives backward. The block a rank keeps for itself is not counted (it never
  leaves the process).
- the dense-gradient **allreduce** of ``P`` payload bytes (MLP gradients, replicated tables'
  gradients, a few scalars). Horovod runs it over Gloo as a ring: reduce-scatter then allgather,
  each rank sending ``2 (N - 1) / N * P`` bytes (and receiving as many). That is the algorithm's
  cost model (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms"); the payload is
  exact, the wire figure is the ring's.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence


@dataclasses.dataclass(frozen=True)
class RankTraffic:
    """One rank's bytes in one training step (forward and backward)."""

    rank: int
    alltoall_forward_sent: int
    alltoall_forward_received: int
    alltoall_backward_sent: int
    alltoall_backward_received: int
    allreduce_payload: int
    allreduce_sent: int

    @property
    def total_sent(self) -> int:
        return self.alltoall_forward_sent + self.alltoall_backward_sent + self.allreduce_sent

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "total_sent": self.total_sent}


def ring_allreduce_sent(payload_bytes: int, world_size: int) -> int:
    """Bytes one rank sends in a ring allreduce of ``payload_bytes``: ``2 (N - 1) / N * P``."""
    if world_size <= 1:
        return 0
    return 2 * (world_size - 1) * payload_bytes // world_size


def step_traffic(send_widths: Sequence[int], global_batch_size: int, exchange_bytes_per_value: int,
                 allreduce_payload_bytes: int) -> list[RankTraffic]:
    """Every rank's bytes per step.

    Args:
        send_widths: columns each rank sends per sample (``W_r``, index = rank); its length is N.
        global_batch_size: samples per step over all ranks, a multiple of N.
        exchange_bytes_per_value: 4 for float32 embeddings, 2 under mixed precision.
        allreduce_payload_bytes: bytes of the dense gradients averaged each step.

    Raises:
        ValueError: on a batch that N does not divide, or a negative width or size.
    """
    world_size = len(send_widths)
    if world_size < 1:
        raise ValueError("Expected at least one rank's send width. Received: send_widths=[]")
    if any(int(w) < 0 for w in send_widths):
        raise ValueError(f"Expected non-negative send widths. Received: send_widths={list(send_widths)}")
    if global_batch_size < 1 or global_batch_size % world_size:
        raise ValueError(f"Expected global_batch_size to be a positive multiple of world_size={world_size}. "
                         f"Received: global_batch_size={global_batch_size}")
    if exchange_bytes_per_value < 1 or allreduce_payload_bytes < 0:
        raise ValueError(f"Expected exchange_bytes_per_value >= 1 and allreduce_payload_bytes >= 0. Received: "
                         f"{exchange_bytes_per_value}, {allreduce_payload_bytes}")
    local_batch = global_batch_size // world_size
    total_width = sum(int(w) for w in send_widths)
    out = []
    for rank, width in enumerate(send_widths):
        sent = (world_size - 1) * local_batch * int(width) * exchange_bytes_per_value if world_size > 1 else 0
        received = local_batch * (total_width - int(width)) * exchange_bytes_per_value if world_size > 1 else 0
        out.append(RankTraffic(rank, sent, received, received, sent, allreduce_payload_bytes,
                               ring_allreduce_sent(allreduce_payload_bytes, world_size)))
    return out


def describe(traffic: Sequence[RankTraffic]) -> str:
    """One line per rank, for the printed plan."""
    lines = ["Bytes per step per rank (sent; the backward alltoall mirrors the forward, allreduce as a ring):"]
    for t in traffic:
        lines.append(f"  rank {t.rank}: alltoall forward sent {t.alltoall_forward_sent:,} received "
                     f"{t.alltoall_forward_received:,}, backward sent {t.alltoall_backward_sent:,} received "
                     f"{t.alltoall_backward_received:,}; allreduce payload {t.allreduce_payload:,} sent "
                     f"{t.allreduce_sent:,}; total sent {t.total_sent:,}")
    return "\n".join(lines)
