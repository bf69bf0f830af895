"""One DCNv2 cross layer: ``x_{l+1} = x0 * (W x_l + b) + x_l`` (full rank or low rank ``W = U V``)."""

from __future__ import annotations

import math

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="tf_dlrm")
class CrossLayer(keras.layers.Layer):
    """The cross layer of DCN-V2 (Wang et al. 2021, "DCN V2: Improved Deep & Cross Network", eq. 1).

    Inputs ``(x0, x_l)``, both ``[b, d]``; output ``x0 * (W x_l + b) + x_l`` (elementwise product),
    ``[b, d]``. With ``low_rank = r > 0`` the matrix is ``W = U V`` with ``V [d, r]`` then ``U [r, d]``
    (section 5.1's low-rank mixture with one expert), which costs ``2 d r`` instead of ``d^2``.

    Args:
        low_rank: 0 for a full ``[d, d]`` matrix, else the rank ``r`` (``0 < r``).
        seed: seed of the Glorot-normal kernel initialisers (every rank builds identical weights).
    """

    def __init__(self, low_rank: int = 0, seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        if isinstance(low_rank, bool) or not isinstance(low_rank, int) or low_rank < 0:
            raise ValueError(f"Expected low_rank to be an integer >= 0 (0: full rank). Received: low_rank={low_rank!r}")
        self.low_rank = low_rank
        self.seed = int(seed)

    def build(self, input_shape):
        width = int(input_shape[0][-1])
        def normal(fan_in, fan_out, offset):
            return keras.initializers.RandomNormal(stddev=math.sqrt(2.0 / (fan_in + fan_out)), seed=self.seed * 7 + offset)
        if self.low_rank:
            self.down = self.add_weight(name="down_kernel", shape=(width, self.low_rank), initializer=normal(width, self.low_rank, 1))
            self.up = self.add_weight(name="up_kernel", shape=(self.low_rank, width), initializer=normal(self.low_rank, width, 2))
        else:
            self.kernel = self.add_weight(name="kernel", shape=(width, width), initializer=normal(width, width, 3))
        self.bias = self.add_weight(name="bias", shape=(width,), initializer="zeros")

    def call(self, inputs):
        x0, x = inputs
        # Row vectors: x W^T in the paper's column notation is x @ kernel here.
        projected = tf.matmul(tf.matmul(x, self.down), self.up) if self.low_rank else tf.matmul(x, self.kernel)
        # bias_add, not ``+``: Grappler fuses MatMul + BiasAdd into one kernel. (Models train through
        # CrossNetwork, whose own gradient sums the bias gradient in float32: see bias.bias_gradient.)
        return x0 * tf.nn.bias_add(projected, self.bias) + x

    def compute_output_shape(self, input_shape):
        return input_shape[0]

    def get_config(self):
        return {**super().get_config(), "low_rank": self.low_rank, "seed": self.seed}
