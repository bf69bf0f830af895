"""The mean over ranks of float32 tensors, sent as bfloat16 and summed in float32.

Horovod 0.28 cannot allreduce bfloat16 (and its float16 range would flush small gradients to zero),
so the reduction is written with two collectives that only move bits:

1. every rank rounds its tensors once to bfloat16, flattens them into one vector cut in N equal
   chunks (zero-padded) and sends chunk k to rank k (``alltoall`` of the 16-bit patterns);
2. rank k adds the N copies of its chunk in float32, divides by N, rounds the mean once to
   bfloat16, and an ``allgather`` of the 16-bit patterns gives every rank the whole mean.

Bytes each rank sends: ``(N - 1) / N * P / 2`` in each step, ``(N - 1) / N * P`` in all for ``P``
bytes of float32 payload: half of a float32 ring allreduce (``2 (N - 1) / N * P``).

Error: each input is rounded once (relative ``u = 2**-8``), the float32 sum adds ``(N - 1)`` float32
roundings, the mean is rounded once: ``|mean_computed - mean| <= 2 u mean_r |g_r|`` to first order.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

from tf_dlrm.parallel import collectives
from tf_dlrm.parallel.env import DistributedEnv


def bfloat16_mean(env: DistributedEnv, tensors: Sequence[tf.Tensor], name: str) -> list[tf.Tensor]:
    """The elementwise mean over ranks of each tensor (returned in its own dtype and shape)."""
    tensors = list(tensors)
    if not env.distributed or not tensors:
        return tensors
    world = env.world_size
    sizes = [int(np.prod(t.shape.as_list())) for t in tensors]
    total = sum(sizes)
    chunk = -(-total // world)  # ceil: every rank owns one chunk of the padded vector
    flat = tf.concat([tf.reshape(tf.cast(t, tf.bfloat16), [-1]) for t in tensors], axis=0)
    flat = tf.pad(flat, [[0, chunk * world - total]])
    # Chunk k of every rank goes to rank k: rank k receives [world, chunk], one row per source.
    received = collectives.alltoall(env, tf.bitcast(flat, tf.uint16), name=f"{name}_scatter")
    copies = tf.cast(tf.bitcast(tf.reshape(received, [world, chunk]), tf.bfloat16), tf.float32)
    mean = tf.cast(tf.reduce_sum(copies, axis=0) / world, tf.bfloat16)
    gathered = collectives.allgather(env, tf.bitcast(mean, tf.uint16), name=f"{name}_gather")
    whole = tf.cast(tf.bitcast(gathered, tf.bfloat16), tf.float32)[:total]
    out, start = [], 0
    for tensor, size in zip(tensors, sizes):
        out.append(tf.cast(tf.reshape(whole[start:start + size], tensor.shape), tensor.dtype))
        start += size
    return out


def sent_bytes(payload_float32_bytes: int, world_size: int) -> int:
    """Bytes one rank sends for a float32 payload of ``payload_float32_bytes``: ``(N - 1) / N * P``."""
    if world_size <= 1:
        return 0
    return (world_size - 1) * payload_float32_bytes // world_size
