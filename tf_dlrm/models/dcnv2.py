"""DCN-V2 (Wang et al. 2021): a cross network and a deep MLP over ``x0 = [numerical, embeddings]``."""

from __future__ import annotations

from typing import Sequence

import keras
import tensorflow as tf

from tf_dlrm.models.config import CrossStructure
from tf_dlrm.models.layers.cross_network import CrossNetwork
from tf_dlrm.models.layers.mlp import MLP
from tf_dlrm.models.family_model import FamilyModel


@keras.saving.register_keras_serializable(package="tf_dlrm")
class DCNv2(FamilyModel):
    """``stacked``: ``logit = MLP(cross(x0))``; ``parallel``: ``logit = w [cross(x0), MLP(x0)] + b``.

    Args:
        embedding, num_numerical, num_deep_features, seed: see :class:`FamilyModel`.
        num_cross_layers: cross layers (>= 1).
        cross_low_rank: 0 (full-rank ``W``) or the rank of ``W = U V``.
        cross_structure: ``stacked`` or ``parallel``.
        deep_mlp_dims: hidden widths of the deep MLP.
    """

    def __init__(self, embedding, num_numerical: int, num_deep_features: int, num_cross_layers: int = 3,
                 cross_low_rank: int = 0, cross_structure: str = "stacked", deep_mlp_dims: Sequence[int] = (512, 256),
                 seed: int = 0, **kwargs):
        super().__init__(embedding, num_numerical, num_deep_features, seed=seed, **kwargs)
        self.num_cross_layers = int(num_cross_layers)
        self.cross_low_rank = int(cross_low_rank)
        self.cross_structure = CrossStructure(cross_structure).value
        self.deep_mlp_dims = tuple(int(d) for d in deep_mlp_dims)
        # The trainer's XLA path looks for an ``interaction`` layer (DLRM's may use a custom kernel).
        self.interaction = CrossNetwork(self.num_cross_layers, self.cross_low_rank, seed=seed * 2 + 1, name="cross_network")
        if self.cross_structure == CrossStructure.STACKED.value:
            self.deep_mlp = MLP(self.deep_mlp_dims + (1,), final_activation=None, seed=seed * 2 + 2, name="deep_mlp")
            self.logit = None
        else:
            self.deep_mlp = MLP(self.deep_mlp_dims, final_activation="relu", seed=seed * 2 + 2, name="deep_mlp")
            self.logit = MLP((1,), final_activation=None, seed=seed * 2 + 3, name="logit")

    def build_dense(self, x0_shape):
        self.interaction.build(x0_shape)
        self.deep_mlp.build(x0_shape)  # stacked: the cross network keeps x0's width
        if self.logit is not None:
            self.logit.build((None, x0_shape[-1] + self.deep_mlp_dims[-1]))

    def dense_call(self, numerical, embeddings):
        deep, _ = self.split_embeddings(embeddings)
        x0 = self.deep_input(numerical, deep)
        crossed = self.interaction(x0)
        if self.logit is None:
            logits = self.deep_mlp(crossed)
        else:
            logits = self.logit(tf.concat([crossed, self.deep_mlp(x0)], axis=1))
        # Logits in float32 under mixed precision: the sigmoid saturates early in bf16.
        return tf.cast(logits, tf.float32)

    def get_config(self):
        return {**super().get_config(), "num_cross_layers": self.num_cross_layers, "cross_low_rank": self.cross_low_rank,
                "cross_structure": self.cross_structure, "deep_mlp_dims": list(self.deep_mlp_dims)}
