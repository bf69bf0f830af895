"""The naive baselines of DCNv2, DeepFM and Wide & Deep: each model as a Keras user writes it first.

One ``keras.layers.Embedding`` per categorical feature (and one width-1 ``Embedding`` per feature for
DeepFM's first order / Wide & Deep's wide part; ``keras.layers.HashedCrossing`` + a width-1
``Embedding`` per crossed feature), ``keras.layers.Dense`` stacks, the cross layer and the FM term
written plainly, and a ``tf.function`` step applying Keras SGD to every trainable variable (as
:mod:`naive_dlrm`). Same architecture and sizes as :mod:`tf_dlrm.models`.
"""

from __future__ import annotations

from typing import Sequence

import keras
import tensorflow as tf

from naive_dlrm import NaiveTrainer


class NaiveCross(keras.layers.Layer):
    """``x0 * (W x + b) + x`` with ``W`` one Dense layer (or two, low rank)."""

    def __init__(self, width: int, low_rank: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.project = [keras.layers.Dense(low_rank, use_bias=False), keras.layers.Dense(width)] if low_rank else [keras.layers.Dense(width)]

    def call(self, x0, x):
        projected = x
        for layer in self.project:
            projected = layer(projected)
        return x0 * projected + x


class NaiveFamilyModel(keras.Model):
    """``(numerical [b, n], categorical tuple of T [b] ids) -> logits [b, 1]`` for ``model`` in
    ``dcnv2``, ``deepfm``, ``wide_deep``."""

    def __init__(self, model: str, cardinalities: Sequence[int], embedding_dim: int, num_numerical: int,
                 deep_mlp_dims: Sequence[int], num_cross_layers: int = 3, cross_low_rank: int = 0,
                 crossed: Sequence[tuple[int, int, int]] = (), **kwargs):
        super().__init__(**kwargs)
        self.kind = model
        self.tables = [keras.layers.Embedding(rows, embedding_dim) for rows in cardinalities]
        self.linear = [keras.layers.Embedding(rows, 1) for rows in cardinalities] if model != "dcnv2" else []
        self.crossings = [(a, b, keras.layers.HashedCrossing(buckets), keras.layers.Embedding(buckets, 1))
                          for a, b, buckets in (crossed if model == "wide_deep" else ())]
        width = num_numerical + embedding_dim * len(cardinalities)
        self.cross = [NaiveCross(width, cross_low_rank) for _ in range(num_cross_layers)] if model == "dcnv2" else []
        self.deep = [keras.layers.Dense(units, activation="relu") for units in deep_mlp_dims] + [keras.layers.Dense(1)]
        self.bias = self.add_weight(shape=(1,), initializer="zeros", name="bias") if model != "dcnv2" else None

    def call(self, inputs):
        numerical, categorical = inputs
        vectors = [table(ids) for table, ids in zip(self.tables, categorical)]
        x = tf.concat([numerical] + vectors, axis=1)
        if self.kind == "dcnv2":
            crossed = x
            for layer in self.cross:
                crossed = layer(x, crossed)
            x = crossed
        deep = x
        for layer in self.deep:
            deep = layer(deep)
        if self.kind == "dcnv2":
            return deep
        linear = [table(ids) for table, ids in zip(self.linear, categorical)]
        linear += [table(crossing((categorical[a], categorical[b]))) for a, b, crossing, table in self.crossings]
        logits = deep + tf.add_n(linear) + self.bias
        if self.kind == "deepfm":
            stacked = tf.stack(vectors, axis=1)
            logits += 0.5 * tf.reduce_sum(tf.square(tf.reduce_sum(stacked, 1)) - tf.reduce_sum(tf.square(stacked), 1), 1, keepdims=True)
        return logits


def build_naive_family(model: str, cardinalities, embedding_dim: int, num_numerical: int, learning_rate: float, **kwargs) -> NaiveTrainer:
    """A built naive model (one call on a dummy batch) and its SGD trainer."""
    network = NaiveFamilyModel(model, cardinalities, embedding_dim, num_numerical, **kwargs)
    network((tf.zeros([1, num_numerical]), tuple(tf.zeros([1], tf.int32) for _ in cardinalities)))
    trainer = NaiveTrainer(network, learning_rate)
    trainer.optimizer.build(network.trainable_variables)
    return trainer
