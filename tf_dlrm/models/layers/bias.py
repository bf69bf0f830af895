"""The gradient of a bias added to every row of a batch: its column sums, accumulated in float32."""

from __future__ import annotations

import tensorflow as tf


def bias_gradient(upstream: tf.Tensor) -> tf.Tensor:
    """``[n, d] -> [d]``: the sum over the rows, as a matmul by a row of ones.

    TensorFlow's ``BiasAddGrad`` sums a bfloat16 gradient in bfloat16 on the CPU: at batch 16,384 its
    sums of unit-scale terms are off by tens (for sums of a few hundred), where the matmul accumulates
    in float32 and rounds once. The matmul is also the faster of the two at every width and precision
    measured on the CPU, float32 included, so it is used at every precision.
    """
    ones = tf.ones(tf.stack([1, tf.shape(upstream)[0]]), upstream.dtype)
    return tf.reshape(tf.matmul(ones, upstream), [-1])
