"""The factorization-machine terms of DeepFM: second order (sum-square trick) and first order."""

from __future__ import annotations

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="tf_dlrm")
class FactorizationMachine(keras.layers.Layer):
    """Second-order FM term of ``[b, F, D]`` field vectors -> ``[b, 1]``.

    ``sum_{i<j} <v_i, v_j> = 1/2 sum_d ((sum_i v_id)^2 - sum_i v_id^2)`` (Rendle 2010, lemma 3.1):
    ``O(F D)`` instead of ``O(F^2 D)``. Reference: Guo et al. 2017, "DeepFM", eq. 2.

    Args:
        scale: factor of the sum (1: the paper's term). DeepFM passes ``1/sqrt(D)``, see there.
    """

    def __init__(self, scale: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        if not (isinstance(scale, (int, float)) and 0.0 < float(scale) < float("inf")):
            raise ValueError(f"Expected a positive finite FM scale. Received: scale={scale!r}")
        self.scale = float(scale)

    def call(self, vectors):
        summed = tf.reduce_sum(vectors, axis=1)
        squares = tf.reduce_sum(tf.square(vectors), axis=1)
        return (0.5 * self.scale) * tf.reduce_sum(tf.square(summed) - squares, axis=1, keepdims=True)

    def get_config(self):
        return {**super().get_config(), "scale": self.scale}

    def compute_output_shape(self, input_shape):
        return (input_shape[0], 1)


@keras.saving.register_keras_serializable(package="tf_dlrm")
class LinearTerm(keras.layers.Layer):
    """First-order term ``b + sum_i w_i`` of ``[b, F]`` looked-up width-1 weights -> ``[b, 1]``.

    The weights ``w`` of each id are width-1 embedding tables (sharded like any table); this layer
    owns the bias ``b`` only. DeepFM's first-order part and Wide & Deep's wide part (one weight per
    id and per crossed id) are this sum.
    """

    def build(self, input_shape):
        self.bias = self.add_weight(name="bias", shape=(1,), initializer="zeros")

    def call(self, weights):
        return tf.reduce_sum(weights, axis=1, keepdims=True) + self.bias

    def compute_output_shape(self, input_shape):
        return (input_shape[0], 1)
