"""Factorization machine (Rendle 2010): a bias, one weight per id, all pairwise dot products of the ids' vectors."""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from tf_dlrm.models.width_one_tables import FirstOrderTables
from tf_dlrm.models.layers.factorization_machine import FactorizationMachine, LinearTerm
from tf_dlrm.models.ranking_model import RankingModel
from tf_dlrm.models.registry import register


@register
@keras.saving.register_keras_serializable(package="tf_dlrm")
class FM(FirstOrderTables, RankingModel):
    """``logit = b + sum_i w[id_i] + sum_{i<j} <v_i, v_j> / sqrt(D) + u . numerical``.

    ``v_i``: the deep embeddings (one width ``D`` for all, the pairwise term needs it); ``w``: width-1
    tables ``linear:<feature>`` read with the same ids (:mod:`tf_dlrm.models.width_one_tables`); ``u``
    starts at zero. DeepFM without its MLP: the second-order model a deep one has to beat.
    """

    model_name = "fm"
    # As DeepFM's (tf_dlrm/models/deepfm.py): its embeddings reach the logit through the pairwise term only.
    embedding_learning_rates = {"lazy_adam": 0.01, "catch_up_adam": 0.01}

    def create_layers(self):
        widths = set(self.embedding.output_widths[:self.num_categorical])
        if len(widths) != 1:
            raise ValueError(f"The FM's pairwise term needs one width for every table. Received widths: {sorted(widths)}")
        self.vector_width = widths.pop()
        # 1/sqrt(D), as DeepFM's: the initial spread and per-step change of the pairwise term stay independent of D.
        self.pairwise = FactorizationMachine(scale=1.0 / math.sqrt(self.vector_width), name="pairwise")
        self.first_order = LinearTerm(name="first_order")
        self.numerical_term = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros", name="numerical")

    def build_dense(self, input_shape):
        self.pairwise.build((None, self.num_categorical, self.vector_width))
        self.first_order.build((None, self.extra_width))
        self.numerical_term.build((None, self.num_numerical))

    def dense_call(self, numerical, embeddings):
        deep, first_order = self.split_embeddings(embeddings)
        vectors = tf.reshape(deep, [-1, self.num_categorical, self.vector_width])
        logits = (self.first_order(first_order) + self.pairwise(vectors)
                  + self.numerical_term(tf.cast(numerical, self.compute_dtype)))
        # Float32 logits under mixed precision: the sigmoid saturates early in bf16.
        return tf.cast(logits, tf.float32)
