"""The naive baseline: DLRM written the way a Keras user would write it first.

26 (one per categorical feature) ``keras.layers.Embedding`` tables, ``keras.layers.Dense`` stacks,
the dot interaction written plainly (stack, ``X X^T``, boolean mask of the strict lower triangle),
and a ``tf.function`` train step that applies Keras SGD to every trainable variable. The
benchmarks measure it in the same process as tf_dlrm so that both see the same machine load.
"""

from __future__ import annotations

from typing import Sequence

import keras
import numpy as np
import tensorflow as tf


class NaiveDLRM(keras.Model):
    """``(numerical [b, n], categorical tuple of T [b] id tensors) -> logits [b, 1]``."""

    def __init__(
        self,
        cardinalities: Sequence[int],
        embedding_dim: int,
        bottom_mlp_dims: Sequence[int],
        top_mlp_dims: Sequence[int],
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.tables = [
            keras.layers.Embedding(rows, embedding_dim, name=f"embedding_{index}")
            for index, rows in enumerate(cardinalities)
        ]
        self.bottom = [keras.layers.Dense(width, activation="relu") for width in bottom_mlp_dims]
        self.top = [keras.layers.Dense(width, activation="relu") for width in top_mlp_dims[:-1]]
        self.top.append(keras.layers.Dense(top_mlp_dims[-1]))
        count = len(cardinalities) + 1
        self.lower_triangle = np.tril(np.ones((count, count), dtype=bool), k=-1)

    def build(self, input_shape):
        numerical_shape, _ = input_shape
        for table in self.tables:
            table.build((None,))
        width = numerical_shape[-1]
        for layer in self.bottom:
            layer.build((None, width))
            width = layer.units
        width += int(self.lower_triangle.sum())
        for layer in self.top:
            layer.build((None, width))
            width = layer.units

    def call(self, inputs):
        numerical, categorical = inputs
        bottom = numerical
        for layer in self.bottom:
            bottom = layer(bottom)
        vectors = [bottom] + [table(ids) for table, ids in zip(self.tables, categorical)]
        stacked = tf.stack(vectors, axis=1)  # [b, T + 1, D]
        products = tf.matmul(stacked, stacked, transpose_b=True)
        pairs = tf.boolean_mask(products, self.lower_triangle, axis=1)  # [b, (T + 1) T / 2]
        top = tf.concat([bottom, pairs], axis=1)
        for layer in self.top:
            top = layer(top)
        return tf.cast(top, tf.float32)


class NaiveTrainer:
    """One ``tf.function`` step: forward, BCE loss, ``tape.gradient``, Keras SGD on everything."""

    def __init__(self, model: NaiveDLRM, learning_rate: float = 0.1, jit_compile: bool = False):
        self.model = model
        self.optimizer = keras.optimizers.SGD(learning_rate=learning_rate)
        self.train_step = tf.function(self._train_step, jit_compile=jit_compile)

    def _train_step(self, numerical, categorical, label):
        with tf.GradientTape() as tape:
            logits = self.model((numerical, categorical))
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits))
        variables = self.model.trainable_variables
        self.optimizer.apply(tape.gradient(loss, variables), variables)
        return loss


def build_naive(
    cardinalities: Sequence[int], embedding_dim: int, bottom_mlp_dims: Sequence[int], top_mlp_dims: Sequence[int],
    num_numerical: int, learning_rate: float = 0.1,
) -> NaiveTrainer:
    """A built naive model and its trainer (weights created by one call on a dummy batch)."""
    model = NaiveDLRM(cardinalities, embedding_dim, bottom_mlp_dims, top_mlp_dims)
    model.build(((None, num_numerical), tuple((None,) for _ in cardinalities)))
    trainer = NaiveTrainer(model, learning_rate)
    trainer.optimizer.build(model.trainable_variables)
    return trainer
