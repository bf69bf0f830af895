"""Wide & Deep (Cheng et al. 2016): a linear model over ids and crossed ids + a deep MLP, one logit."""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from tf_dlrm.embedding import optimizers as table_optimizers
from tf_dlrm.models.layers.factorization_machine import LinearTerm
from tf_dlrm.models.layers.mlp import MLP
from tf_dlrm.models import width_one_tables
from tf_dlrm.models.ranking_model import RankingModel, check_dropout, check_widths, option
from tf_dlrm.models.registry import register

# Sparse optimizers the wide tables may use instead of the embedding optimizer ("": the embedding
# optimizer's); the paper trained its wide part with FTRL.
WIDE_OPTIMIZERS = ("", "ftrl", "adagrad")


@dataclasses.dataclass(frozen=True)
class WideDeepConfig:
    deep_mlp_dims: tuple[int, ...] = option((512, 256), "Hidden widths of the deep MLP (a one-unit logit layer follows).")
    wide_optimizer: str = option("", "Sparse optimizer of the wide tables, ftrl or adagrad (empty: --embedding_optimizer); "
                                 "the Wide & Deep paper used FTRL.")
    wide_learning_rate: float = option(0.0, "Base rate of --wide_optimizer on the schedule (0: the embedding optimizer's rate).")
    deep_mlp_dropout: float = option(0.0, "Dropout rate after each hidden layer of the deep MLP, in training only (0: none).")
    deep_mlp_layer_norm: bool = option(False, "Layer normalization of each hidden layer of the deep MLP, before its ReLU.")

    def __post_init__(self):
        object.__setattr__(self, "deep_mlp_dims", check_widths(self.deep_mlp_dims, "deep_mlp_dims"))
        object.__setattr__(self, "deep_mlp_dropout", check_dropout(self.deep_mlp_dropout, "deep_mlp_dropout"))
        if self.wide_optimizer not in WIDE_OPTIMIZERS:
            raise ValueError(f"Expected --wide_optimizer in {[o for o in WIDE_OPTIMIZERS if o]} (or empty: the embedding "
                             f"optimizer). Received: --wide_optimizer={self.wide_optimizer!r}")
        if not self.wide_learning_rate >= 0:
            raise ValueError(f"Expected --wide_learning_rate >= 0. Received: --wide_learning_rate={self.wide_learning_rate}")


@register
@keras.saving.register_keras_serializable(package="tf_dlrm")
class WideDeep(RankingModel):
    """``logit = b + sum_i w[id_i] + sum_c w_c[cross_c] + MLP([numerical, e_1, ..., e_T])``.

    The wide weights are width-1 tables (``linear:<feature>``, and one per crossed feature of the
    spec, see :mod:`tf_dlrm.models.width_one_tables`), sharded and updated sparsely like the deep tables.
    """

    model_name = "wide_deep"
    Config = WideDeepConfig
    # As DeepFM's (tf_dlrm/models/deepfm.py): on synthetic_small 0.01 raised Wide & Deep from 0.8135
    # to 0.8185 (100k rows) and 0.8215 to 0.8239 (300k) over 0.003, with lazy_adam; catch-up Adam (the
    # default table optimizer, lazy Adam plus the skipped steps' moves) keeps the same rate.
    embedding_learning_rates = {"lazy_adam": 0.01, "catch_up_adam": 0.01}

    @classmethod
    def tables(cls, config, deep, crossed=()):
        return width_one_tables.check_unique_names(
            list(deep) + width_one_tables.linear_tables(deep) + width_one_tables.crossed_tables(deep, crossed))

    @classmethod
    def features(cls, config, deep, crossed=()):
        linear, linear_sources = width_one_tables.linear_features(deep)
        cross, cross_sources = width_one_tables.crossed_features(deep, crossed)
        return (tuple(deep) + tuple(linear) + tuple(cross),
                tuple(("column", i) for i in range(len(deep))) + tuple(linear_sources) + tuple(cross_sources))

    def create_layers(self):
        if self.extra_width < self.num_categorical:
            raise ValueError(f"Wide & Deep needs one width-1 (wide) feature per categorical feature. Received: "
                             f"{self.extra_width} wide columns for {self.num_categorical} features")
        self.wide = LinearTerm(name="wide")
        self.deep_mlp = MLP(self.model_config.deep_mlp_dims + (1,), final_activation=None, seed=self.seed * 2 + 2,
                            dropout=self.model_config.deep_mlp_dropout,
                            layer_norm=self.model_config.deep_mlp_layer_norm, name="deep_mlp")

    def build_dense(self, x0_shape):
        self.wide.build((None, self.extra_width))
        self.deep_mlp.build(x0_shape)

    def dense_call(self, numerical, embeddings, training=None):
        deep, wide = self.split_embeddings(embeddings)
        logits = self.wide(wide) + self.deep_mlp(self.deep_input(numerical, deep), training=training)
        return tf.cast(logits, tf.float32)

    @classmethod
    def table_optimizers(cls, config, tables, num_deep):
        """The wide tables (every table after the deep ones), when ``wide_optimizer`` is set, at
        ``wide_learning_rate`` (0: the embedding rate)."""
        if not config.wide_optimizer:
            return {}
        optimizer = table_optimizers.get(config.wide_optimizer)
        optimizer = dataclasses.replace(optimizer, learning_rate=config.wide_learning_rate or None)
        return {table: optimizer for table in range(num_deep, len(tables))}
