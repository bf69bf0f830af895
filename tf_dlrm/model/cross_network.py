"""The DCNv2 cross network: ``num_layers`` cross layers, each fed ``x0`` and the previous output."""

from __future__ import annotations

import keras

from tf_dlrm.model.cross_layer import CrossLayer


@keras.saving.register_keras_serializable(package="tf_dlrm")
class CrossNetwork(keras.layers.Layer):
    """``x_{l+1} = x0 * (W_l x_l + b_l) + x_l`` for ``l = 0 .. num_layers - 1``; ``[b, d] -> [b, d]``.

    Args:
        num_layers: cross layers (>= 1).
        low_rank: 0 for full-rank matrices, else their rank (see :class:`CrossLayer`).
        seed: base seed of the layers' initialisers.
    """

    def __init__(self, num_layers: int, low_rank: int = 0, seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"Expected num_layers to be a positive integer. Received: num_layers={num_layers!r}")
        self.num_layers = num_layers
        self.low_rank = low_rank
        self.seed = int(seed)
        self.cross_layers = [CrossLayer(low_rank, seed=self.seed * 31 + index, dtype=self.dtype_policy, name=f"cross_{index}")
                             for index in range(num_layers)]

    def build(self, input_shape):
        for layer in self.cross_layers:
            layer.build((input_shape, input_shape))

    def call(self, x0):
        x = x0
        for layer in self.cross_layers:
            x = layer((x0, x))
        return x

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "num_layers": self.num_layers, "low_rank": self.low_rank, "seed": self.seed}
