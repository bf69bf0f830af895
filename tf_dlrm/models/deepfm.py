"""DeepFM (Guo et al. 2017): first-order weights + FM second-order term + deep MLP, one logit."""

from __future__ import annotations

import dataclasses
import math

import keras
import tensorflow as tf

from tf_dlrm.models.layers.factorization_machine import FactorizationMachine, LinearTerm
from tf_dlrm.models.layers.mlp import MLP
from tf_dlrm.models.width_one_tables import FirstOrderTables
from tf_dlrm.models.ranking_model import RankingModel, check_dropout, check_widths, option
from tf_dlrm.models.registry import register


@dataclasses.dataclass(frozen=True)
class DeepFMConfig:
    deep_mlp_dims: tuple[int, ...] = option((512, 256), "Hidden widths of the deep MLP (a one-unit logit layer follows).")
    deep_mlp_dropout: float = option(0.0, "Dropout rate after each hidden layer of the deep MLP, in training only (0: none).")
    deep_mlp_layer_norm: bool = option(False, "Layer normalization of each hidden layer of the deep MLP, before its ReLU.")

    def __post_init__(self):
        object.__setattr__(self, "deep_mlp_dims", check_widths(self.deep_mlp_dims, "deep_mlp_dims"))
        object.__setattr__(self, "deep_mlp_dropout", check_dropout(self.deep_mlp_dropout, "deep_mlp_dropout"))


@register
@keras.saving.register_keras_serializable(package="tf_dlrm")
class DeepFM(FirstOrderTables, RankingModel):
    """``logit = b + sum_i w[id_i] + sum_{i<j} <v_i, v_j> / sqrt(D) + MLP([numerical, v_1, ..., v_T])``.

    ``v_i``: the deep embeddings (one width for all, the FM needs it); ``w``: width-1 tables
    ``linear:<feature>`` read with the same ids (:mod:`tf_dlrm.models.width_one_tables`).
    """

    model_name = "deepfm"
    Config = DeepFMConfig
    # Its embeddings reach the logit only through the deep MLP's first layer and the FM term, where
    # one step of a D-wide embedding moves the logit about as much as one step of a width-1 weight:
    # at the flag's 0.003 they learn too slowly in a short run (benchmarks/results/model_quality.md: on
    # synthetic_small 0.01 raised DeepFM from 0.8101 to 0.8173 at 100k rows, 0.8196 to 0.8223 at
    # 300k; measured with lazy_adam). Catch-up Adam takes the same rate: on the real datasets of
    # benchmarks/results/quality_real.md DeepFM with it at 0.01 is level with or above lazy Adam at 0.01.
    embedding_learning_rates = {"lazy_adam": 0.01, "catch_up_adam": 0.01}

    def create_layers(self):
        widths = set(self.embedding.output_widths[:self.num_categorical])
        if len(widths) != 1:
            raise ValueError(f"DeepFM's FM term needs one width for every deep table. Received widths: {sorted(widths)}")
        if self.extra_width != self.num_categorical:
            raise ValueError(f"DeepFM needs one width-1 (first-order) feature per categorical feature. Received: "
                             f"{self.extra_width} first-order columns for {self.num_categorical} features")
        self.vector_width = widths.pop()
        # The FM term sums F(F-1)/2 dot products of D-wide vectors: its spread at initialisation and
        # the change one Adam step makes to it grow with D. 1/sqrt(D), as in scaled dot-product
        # attention (Vaswani et al. 2017), makes the initial spread independent of the width and
        # slows the term's per-step change by the same factor.
        self.factorization_machine = FactorizationMachine(scale=1.0 / math.sqrt(self.vector_width), name="factorization_machine")
        self.first_order = LinearTerm(name="first_order")
        self.deep_mlp = MLP(self.model_config.deep_mlp_dims + (1,), final_activation=None, seed=self.seed * 2 + 2,
                            dropout=self.model_config.deep_mlp_dropout,
                            layer_norm=self.model_config.deep_mlp_layer_norm, name="deep_mlp")

    def build_dense(self, x0_shape):
        self.factorization_machine.build((None, self.num_categorical, self.vector_width))
        self.first_order.build((None, self.extra_width))
        self.deep_mlp.build(x0_shape)

    def dense_call(self, numerical, embeddings, training=None):
        deep, first_order = self.split_embeddings(embeddings)
        vectors = tf.reshape(deep, [-1, self.num_categorical, self.vector_width])
        logits = (self.first_order(first_order) + self.factorization_machine(vectors)
                  + self.deep_mlp(self.deep_input(numerical, deep), training=training))
        return tf.cast(logits, tf.float32)
