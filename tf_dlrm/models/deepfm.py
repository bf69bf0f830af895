"""DeepFM (Guo et al. 2017): first-order weights + FM second-order term + deep MLP, one logit."""

from __future__ import annotations

import math
from typing import Sequence

import keras
import tensorflow as tf

from tf_dlrm.models.layers.factorization_machine import FactorizationMachine, LinearTerm
from tf_dlrm.models.layers.mlp import MLP
from tf_dlrm.models.family_model import FamilyModel


@keras.saving.register_keras_serializable(package="tf_dlrm")
class DeepFM(FamilyModel):
    """``logit = b + sum_i w[id_i] + sum_{i<j} <v_i, v_j> / sqrt(D) + MLP([numerical, v_1, ..., v_T])``.

    ``v_i``: the deep embeddings (one width for all, the FM needs it); ``w``: width-1 tables
    ``linear:<feature>`` read with the same ids (see :mod:`tf_dlrm.models.tables`).

    Args:
        embedding, num_numerical, num_deep_features, seed: see :class:`FamilyModel`.
        deep_mlp_dims: hidden widths of the deep MLP.
    """

    def __init__(self, embedding, num_numerical: int, num_deep_features: int, deep_mlp_dims: Sequence[int] = (512, 256),
                 seed: int = 0, **kwargs):
        super().__init__(embedding, num_numerical, num_deep_features, seed=seed, **kwargs)
        widths = set(embedding.feature_widths[:self.num_deep_features])
        if len(widths) != 1:
            raise ValueError(f"DeepFM's FM term needs one width for every deep table. Received widths: {sorted(widths)}")
        if self.extra_width != self.num_deep_features:
            raise ValueError(f"DeepFM needs one width-1 (first-order) feature per categorical feature. Received: "
                             f"{self.extra_width} first-order columns for {self.num_deep_features} features")
        self.vector_width = widths.pop()
        self.deep_mlp_dims = tuple(int(d) for d in deep_mlp_dims)
        # The FM term sums F(F-1)/2 dot products of D-wide vectors: its spread at initialisation and
        # the change one Adam step makes to it grow with D (std ~0.6 logits at D=128 on the 8 fields of
        # synthetic_small, which 100 steps cannot unlearn). 1/sqrt(D), as in scaled dot-product
        # attention (Vaswani et al. 2017), makes the initial spread independent of the width and
        # slows the term's per-step change by the same factor.
        self.interaction = FactorizationMachine(scale=1.0 / math.sqrt(self.vector_width), name="factorization_machine")
        self.first_order = LinearTerm(name="first_order")
        self.deep_mlp = MLP(self.deep_mlp_dims + (1,), final_activation=None, seed=seed * 2 + 2, name="deep_mlp")

    def build_dense(self, x0_shape):
        self.interaction.build((None, self.num_deep_features, self.vector_width))
        self.first_order.build((None, self.extra_width))
        self.deep_mlp.build(x0_shape)

    def dense_call(self, numerical, embeddings):
        deep, first_order = self.split_embeddings(embeddings)
        vectors = tf.reshape(deep, [-1, self.num_deep_features, self.vector_width])
        logits = self.first_order(first_order) + self.interaction(vectors) + self.deep_mlp(self.deep_input(numerical, deep))
        return tf.cast(logits, tf.float32)

    def get_config(self):
        return {**super().get_config(), "deep_mlp_dims": list(self.deep_mlp_dims)}
