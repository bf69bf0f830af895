"""DCN-V2 (Wang et al. 2021): a cross network and a deep MLP over ``x0 = [numerical, embeddings]``."""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from tf_dlrm.embedding.table_config import FrequencyRegularizer
from tf_dlrm.models.layers.cross_network import CrossNetwork
from tf_dlrm.models.layers.mlp import MLP
from tf_dlrm.models.ranking_model import RankingModel, check_cross, check_dropout, check_widths, option
from tf_dlrm.models.registry import register

STACKED, PARALLEL = "stacked", "parallel"


@dataclasses.dataclass(frozen=True)
class DCNv2Config:
    num_cross_layers: int = option(3, "Cross layers.")
    cross_low_rank: int = option(0, "Rank r of each cross matrix W = U V (0: full rank).")
    cross_structure: str = option(STACKED, "Deep MLP after the cross network (stacked) or beside it (parallel).",
                                  choices=[STACKED, PARALLEL])
    deep_mlp_dims: tuple[int, ...] = option((512, 256), "Hidden widths of the deep MLP (a one-unit logit layer follows).")
    deep_mlp_dropout: float = option(0.0, "Dropout rate after each hidden layer of the deep MLP, in training only (0: none).")
    deep_mlp_layer_norm: bool = option(False, "Layer normalization of each hidden layer of the deep MLP, before its ReLU.")

    def __post_init__(self):
        check_cross(self.num_cross_layers, self.cross_low_rank)
        if self.cross_structure not in (STACKED, PARALLEL):
            raise ValueError(f"Expected --cross_structure in {[STACKED, PARALLEL]}. Received: --cross_structure={self.cross_structure!r}")
        object.__setattr__(self, "deep_mlp_dims", check_widths(self.deep_mlp_dims, "deep_mlp_dims"))
        object.__setattr__(self, "deep_mlp_dropout", check_dropout(self.deep_mlp_dropout, "deep_mlp_dropout"))


@register
@keras.saving.register_keras_serializable(package="tf_dlrm")
class DCNv2(RankingModel):
    """``stacked``: ``logit = MLP(cross(x0))``; ``parallel``: ``logit = w [cross(x0), MLP(x0)] + b``."""

    model_name = "dcnv2"
    Config = DCNv2Config
    # Rare ids regularized unless --embedding_frequency_l2 or --embedding_min_count is given: on the three real
    # datasets of benchmarks/results/quality_real.md (calibrated, early stopping on validation) it raised
    # DCNv2's test AUC on each (Frappe 0.9474 -> 0.9505, KDD 2012 0.6805 -> 0.6832, MovieLens-100k 0.7850 ->
    # 0.7854) and lowered its NE on each; for DeepFM and Wide & Deep it cost AUC on Frappe or KDD.
    default_frequency_regularizer = FrequencyRegularizer(l2=25.0, min_count=2)

    def create_layers(self):
        config = self.model_config
        self.cross_network = CrossNetwork(config.num_cross_layers, config.cross_low_rank, seed=self.seed * 2 + 1,
                                          name="cross_network")
        if config.cross_structure == STACKED:
            self.deep_mlp = MLP(config.deep_mlp_dims + (1,), final_activation=None, seed=self.seed * 2 + 2,
                                dropout=config.deep_mlp_dropout, layer_norm=config.deep_mlp_layer_norm, name="deep_mlp")
            self.logit = None
        else:
            self.deep_mlp = MLP(config.deep_mlp_dims, final_activation="relu", seed=self.seed * 2 + 2,
                                dropout=config.deep_mlp_dropout, layer_norm=config.deep_mlp_layer_norm, name="deep_mlp")
            self.logit = MLP((1,), final_activation=None, seed=self.seed * 2 + 3, name="logit")

    def build_dense(self, x0_shape):
        self.cross_network.build(x0_shape)
        self.deep_mlp.build(x0_shape)  # stacked: the cross network keeps x0's width
        if self.logit is not None:
            self.logit.build((None, x0_shape[-1] + self.model_config.deep_mlp_dims[-1]))

    def dense_call(self, numerical, embeddings, training=None):
        deep, _ = self.split_embeddings(embeddings)
        x0 = self.deep_input(numerical, deep)
        crossed = self.cross_network(x0)
        if self.logit is None:
            logits = self.deep_mlp(crossed, training=training)
        else:
            logits = self.logit(tf.concat([crossed, self.deep_mlp(x0, training=training)], axis=1))
        # Logits in float32 under mixed precision: the sigmoid saturates early in bf16.
        return tf.cast(logits, tf.float32)
