"""The key mix of :mod:`tf_dlrm.sharding.dynamic_routing` in TensorFlow, and new rows' initial values.

A new row's values depend on ``(seed, table, key)`` only, never on the rank, the shard, the row it
lands in or the step, so ``N`` ranks insert exactly the rows one process inserts, and a key evicted
and seen again restarts from the same values.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_dlrm.sharding import dynamic_routing as routing
from tf_dlrm.sharding.dynamic_routing import GOLDEN, MASK64, MIX_1, MIX_2

_24_BITS = float(1 << 24)


def _u64(value: int) -> tf.Tensor:
    return tf.constant(value, tf.uint64)


def mix64(words: tf.Tensor) -> tf.Tensor:
    """SplitMix64's finaliser of ``words + GOLDEN`` (uint64 in, uint64 out; wraps modulo 2^64)."""
    z = words + _u64(GOLDEN)
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _u64(30))) * _u64(MIX_1)
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _u64(27))) * _u64(MIX_2)
    return tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _u64(31)))


def owner_shard(keys: tf.Tensor, num_shards: int) -> tf.Tensor:
    """The shard (int64) of each int64 key: ``(mix64(key) >> 1) mod num_shards``."""
    mixed = tf.bitwise.right_shift(mix64(tf.bitcast(keys, tf.uint64)), _u64(1))
    return tf.math.floormod(tf.bitcast(mixed, tf.int64), tf.constant(num_shards, tf.int64))


def initial_rows(keys: tf.Tensor, seed: int, table: int, width: int, bound: float) -> tf.Tensor:
    """``[n, width]`` float32 uniform in ``[-bound, bound)``: column ``c`` of key ``k`` is the top 24
    bits of ``mix64(mix64(k xor mix64(seed, table)) + c * GOLDEN)`` scaled to the interval."""
    salt = int(routing.mix64(np.array([(int(seed) * 1_000_003 + int(table)) & MASK64], np.uint64).view(np.int64))[0])
    base = mix64(tf.bitwise.bitwise_xor(tf.bitcast(keys, tf.uint64), _u64(salt)))  # [n]
    columns = tf.range(1, width + 1, dtype=tf.int64)
    offsets = tf.bitcast(columns, tf.uint64) * _u64(GOLDEN)  # [width]
    words = mix64(base[:, None] + offsets[None, :])
    unit = tf.cast(tf.bitwise.right_shift(words, _u64(40)), tf.float32) / _24_BITS  # [0, 1)
    return (2.0 * unit - 1.0) * bound
