"""Wide & Deep (Cheng et al. 2016): a linear model over ids and crossed ids + a deep MLP, one logit."""

from __future__ import annotations

from typing import Sequence

import keras
import tensorflow as tf

from tf_dlrm.models.layers.factorization_machine import LinearTerm
from tf_dlrm.models.layers.mlp import MLP
from tf_dlrm.models.family_model import FamilyModel


@keras.saving.register_keras_serializable(package="tf_dlrm")
class WideDeep(FamilyModel):
    """``logit = b + sum_i w[id_i] + sum_c w_c[cross_c] + MLP([numerical, e_1, ..., e_T])``.

    The wide weights are width-1 tables (``linear:<feature>``, and one per crossed feature of the
    spec, see :mod:`tf_dlrm.models.tables`), sharded and updated sparsely like the deep tables.

    Args:
        embedding, num_numerical, num_deep_features, seed: see :class:`FamilyModel`.
        deep_mlp_dims: hidden widths of the deep MLP.
        wide_optimizer: sparse optimizer of the wide tables (``""``: the embedding optimizer's).
        wide_learning_rate: its base rate (0: the embedding optimizer's).
    """

    def __init__(self, embedding, num_numerical: int, num_deep_features: int, deep_mlp_dims: Sequence[int] = (512, 256),
                 seed: int = 0, wide_optimizer: str = "", wide_learning_rate: float = 0.0, **kwargs):
        super().__init__(embedding, num_numerical, num_deep_features, seed=seed, **kwargs)
        if self.extra_width < self.num_deep_features:
            raise ValueError(f"Wide & Deep needs one width-1 (wide) feature per categorical feature. Received: "
                             f"{self.extra_width} wide columns for {self.num_deep_features} features")
        self.deep_mlp_dims = tuple(int(d) for d in deep_mlp_dims)
        self.wide_optimizer, self.wide_learning_rate = str(wide_optimizer), float(wide_learning_rate)
        self.interaction = LinearTerm(name="wide")
        self.deep_mlp = MLP(self.deep_mlp_dims + (1,), final_activation=None, seed=seed * 2 + 2, name="deep_mlp")

    def build_dense(self, x0_shape):
        self.interaction.build((None, self.extra_width))
        self.deep_mlp.build(x0_shape)

    def dense_call(self, numerical, embeddings):
        deep, wide = self.split_embeddings(embeddings)
        logits = self.interaction(wide) + self.deep_mlp(self.deep_input(numerical, deep))
        return tf.cast(logits, tf.float32)

    def table_optimizer_choices(self) -> dict[int, tuple[str, float]]:
        """``{table index: (sparse optimizer name, base rate)}`` of the wide tables when they train with
        their own optimizer (read by :class:`tf_dlrm.train.step.Trainer`); empty otherwise."""
        if not self.wide_optimizer:
            return {}
        wide = {self.embedding.feature_tables[f] for f in range(self.num_deep_features, self.embedding.num_features)}
        return {table: (self.wide_optimizer, self.wide_learning_rate) for table in sorted(wide)}

    def get_config(self):
        return {**super().get_config(), "deep_mlp_dims": list(self.deep_mlp_dims), "wide_optimizer": self.wide_optimizer,
                "wide_learning_rate": self.wide_learning_rate}
