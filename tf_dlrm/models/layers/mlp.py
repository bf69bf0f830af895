"""A multilayer perceptron: the bottom MLP over numerical features and the top MLP over interactions."""

from __future__ import annotations

import math
from typing import Sequence

import keras


@keras.saving.register_keras_serializable(package="tf_dlrm")
class MLP(keras.layers.Layer):
    """A stack of dense layers with ReLU between them.

    Weights follow the DLRM reference initialisation: kernels ``N(0, sqrt(2 / (fan_in + fan_out)))``,
    biases ``N(0, sqrt(1 / fan_out))``, seeded so every rank builds identical weights.

    Args:
        units: widths of the layers, e.g. ``(512, 256, 128)``.
        final_activation: activation of the last layer (``"relu"`` for the bottom MLP, ``None`` for
            the top MLP, whose last unit is the logit).
        seed: base seed of the initialisers.
    """

    def __init__(self, units: Sequence[int], final_activation: str | None = "relu", seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        units = tuple(int(u) for u in units)
        if not units or any(u <= 0 for u in units):
            raise ValueError(f"Expected a non-empty list of positive layer widths. Received: units={list(units)}")
        self.units = units
        self.final_activation = final_activation
        self.seed = int(seed)
        self.dense_layers = []

    def build(self, input_shape):
        fan_in = int(input_shape[-1])
        for index, width in enumerate(self.units):
            last = index == len(self.units) - 1
            layer = keras.layers.Dense(
                width,
                activation=self.final_activation if last else "relu",
                kernel_initializer=keras.initializers.RandomNormal(
                    stddev=math.sqrt(2.0 / (fan_in + width)), seed=self.seed * 1009 + 2 * index
                ),
                bias_initializer=keras.initializers.RandomNormal(
                    stddev=math.sqrt(1.0 / width), seed=self.seed * 1009 + 2 * index + 1
                ),
                dtype=self.dtype_policy,
                name=f"dense_{index}",
            )
            layer.build((None, fan_in))
            self.dense_layers.append(layer)
            fan_in = width

    def call(self, inputs):
        outputs = inputs
        for layer in self.dense_layers:
            outputs = layer(outputs)
        return outputs

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.units[-1])

    def get_config(self):
        return {**super().get_config(), "units": list(self.units), "final_activation": self.final_activation, "seed": self.seed}
