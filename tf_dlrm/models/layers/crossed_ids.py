"""Crossed ids of Wide & Deep: two id columns hashed into one (see tf_dlrm.spec.crossed_features)."""

from __future__ import annotations

import tensorflow as tf

from tf_dlrm.spec.crossed_features import MODULUS, MULTIPLIER


def crossed_ids(first, second, second_cardinality: int, buckets: int) -> tf.Tensor:
    """``[b]`` ids in ``[0, buckets)`` of the pairs ``(first[i], second[i])``; int64 arithmetic,
    equal to :func:`tf_dlrm.spec.crossed_features.crossed_bucket` element by element."""
    first, second = tf.cast(first, tf.int64), tf.cast(second, tf.int64)
    pair = tf.math.floormod(first * second_cardinality + second, MODULUS)
    return tf.math.floormod(tf.math.floormod(pair * MULTIPLIER, MODULUS), buckets)
