"""Logistic regression on the sharded embedding: one weight per id, a linear term of the numerical features.

``logit = b + sum_i w_i[id_i] + v . numerical``: the baseline a CTR model has to beat. Each
categorical feature reads a width-1 table named like it (sharded and updated sparsely as any table,
by the embedding optimizer); ``v`` and ``b`` are dense weights (the dense optimizer). ``v`` starts at
zero, so the first logit is ``b + sum_i w_i`` of the tables' small initial values.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from tf_dlrm.models.layers.factorization_machine import LinearTerm
from tf_dlrm.models.ranking_model import RankingModel
from tf_dlrm.models.registry import register


@register
@keras.saving.register_keras_serializable(package="tf_dlrm")
class LogisticRegression(RankingModel):
    """``--model=logistic_regression``: no hyper-parameters of its own; ``--embedding_dim`` is not used
    (every table has width 1)."""

    model_name = "logistic_regression"

    @classmethod
    def tables(cls, config, deep, crossed=()):
        return [dataclasses.replace(table, embedding_dim=1) for table in deep]

    def create_layers(self):
        widths = set(self.embedding.output_widths)
        if widths != {1}:
            raise ValueError(f"Logistic regression reads width-1 tables. Received widths: {sorted(widths)}")
        self.ids_term = LinearTerm(name="ids")  # b + sum of the looked-up weights
        self.numerical_term = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros", name="numerical")

    def build_dense(self, input_shape):
        self.ids_term.build((None, self.deep_width + self.extra_width))
        self.numerical_term.build((None, self.num_numerical))

    def dense_call(self, numerical, embeddings):
        logits = self.ids_term(self.flat_embeddings(embeddings)) + self.numerical_term(tf.cast(numerical, self.compute_dtype))
        # Float32 logits under mixed precision: the sigmoid saturates early in bf16.
        return tf.cast(logits, tf.float32)
