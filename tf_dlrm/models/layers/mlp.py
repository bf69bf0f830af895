"""A multilayer perceptron: the bottom MLP over numerical features and the top MLP over interactions."""

from __future__ import annotations

import math
from typing import Sequence

import keras
import tensorflow as tf

from tf_dlrm.models.layers.bias import bias_gradient


@keras.saving.register_keras_serializable(package="tf_dlrm")
class MLP(keras.layers.Layer):
    """A stack of dense layers with ReLU between them.

    Weights follow the DLRM reference initialisation: kernels ``N(0, sqrt(2 / (fan_in + fan_out)))``,
    biases ``N(0, sqrt(1 / fan_out))``, seeded so every rank builds identical weights.

    Args:
        units: widths of the layers, e.g. ``(512, 256, 128)``.
        final_activation: activation of the last layer (``"relu"`` for the bottom MLP, ``None`` for
            the top MLP, whose last unit is the logit).
        seed: base seed of the initialisers (and of the dropout masks).
        dropout: the rate at which each hidden layer's outputs (every layer's but the last) are zeroed
            in training, the kept ones scaled by ``1 / (1 - dropout)``; never in evaluation or export.
            0 (the default) adds no operation at all.
        layer_norm: normalize each hidden layer's pre-activations over its units (Ba et al. 2016, learnt
            scale and offset) before its ReLU; per sample, so it is the same on any split of a batch.
    """

    def __init__(self, units: Sequence[int], final_activation: str | None = "relu", seed: int = 0, dropout: float = 0.0,
                 layer_norm: bool = False, **kwargs):
        super().__init__(**kwargs)
        units = tuple(int(u) for u in units)
        if not units or any(u <= 0 for u in units):
            raise ValueError(f"Expected a non-empty list of positive layer widths. Received: units={list(units)}")
        self.units = units
        self.final_activation = final_activation
        self.seed = int(seed)
        dropout = float(dropout)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"Expected an MLP dropout rate in [0, 1). Received: dropout={dropout}")
        self.dropout = dropout
        self.layer_norm = bool(layer_norm)
        self.dense_layers = []
        self.norm_layers = []

    def build(self, input_shape):
        fan_in = int(input_shape[-1])
        for index, width in enumerate(self.units):
            last = index == len(self.units) - 1
            layer = keras.layers.Dense(
                width,
                activation=self.final_activation if last else (None if self.layer_norm else "relu"),
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
            if self.layer_norm and not last:
                norm = keras.layers.LayerNormalization(dtype=self.dtype_policy, name=f"layer_norm_{index}")
                norm.build((None, width))
                self.norm_layers.append(norm)
            fan_in = width

    def call(self, inputs, training=None):
        outputs = inputs
        last = len(self.dense_layers) - 1
        for index, layer in enumerate(self.dense_layers):
            outputs = dense(outputs, layer)
            if self.layer_norm and index < last:
                outputs = keras.activations.relu(self.norm_layers[index](outputs))
            if self.dropout and training and index < last:
                # tf.nn.dropout holds no variable (keras.layers.Dropout keeps its seed generator's state in one), so
                # the model's variables, checkpoints and their resharding stay those of a model without dropout.
                # Its op seed is fixed per layer; keras.utils.set_random_seed (the builder's) sets the graph seed.
                outputs = tf.nn.dropout(outputs, rate=self.dropout, seed=self.seed * 1009 + 2 * index)
        return outputs

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.units[-1])

    def get_config(self):
        return {**super().get_config(), "units": list(self.units), "final_activation": self.final_activation, "seed": self.seed,
                "dropout": self.dropout, "layer_norm": self.layer_norm}


def dense(inputs, layer: keras.layers.Dense):
    """``layer(inputs)``, its bias gradient summed in float32 (:func:`tf_dlrm.models.layers.bias.bias_gradient`;
    Keras's would be a bfloat16 ``BiasAddGrad`` under mixed precision).

    The forward ops are the layer's own (matmul, bias add, ReLU), which the graph optimizer fuses into
    one oneDNN call as before; the kernel and bias arrive cast to the compute dtype, so their float32
    gradients come from the casts' own gradients as in ``layer(inputs)``. An activation other than ReLU
    (a user's ``final_activation``) is applied after, with its own gradient.
    """
    relu = layer.activation is keras.activations.relu
    compute = layer.compute_dtype
    x = tf.cast(inputs, compute)
    kernel = tf.cast(tf.convert_to_tensor(layer.kernel), compute)
    bias = tf.cast(tf.convert_to_tensor(layer.bias), compute)
    outputs = _dense(x, kernel, bias, relu)
    if relu or layer.activation is keras.activations.linear:
        return outputs
    return layer.activation(outputs)


def _dense(x, kernel, bias, relu: bool):
    @tf.custom_gradient
    def forward(x, kernel, bias):
        outputs = tf.nn.bias_add(tf.matmul(x, kernel), bias)
        if relu:
            outputs = tf.nn.relu(outputs)

        def backward(upstream):
            pre_activation = tf.raw_ops.ReluGrad(gradients=upstream, features=outputs) if relu else upstream
            return (tf.matmul(pre_activation, kernel, transpose_b=True),
                    tf.matmul(x, pre_activation, transpose_a=True),
                    bias_gradient(pre_activation))

        return outputs, backward

    return forward(x, kernel, bias)
