"""DLRM (Naumov et al. 2019): bottom MLP over numerical features, dot / cat interaction, top MLP, one logit."""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from tf_dlrm.models.layers.interaction import InteractionKind, interaction_paths, make_interaction
from tf_dlrm.models.layers.mlp import MLP
from tf_dlrm.models.ranking_model import RankingModel, check_cross, check_dropout, check_widths, option
from tf_dlrm.models.registry import register


@dataclasses.dataclass(frozen=True)
class DLRMConfig:
    bottom_mlp_dims: tuple[int, ...] = option((512, 256, 128), "Bottom MLP widths; the last equals --embedding_dim for dot.")
    top_mlp_dims: tuple[int, ...] = option((1024, 1024, 512, 256, 1), "Top MLP widths; the last is 1.")
    interaction: str = option("dot", "Feature interaction: dot (the strict lower triangle of pairwise dot products of the "
                              "bottom MLP's output and the embeddings), cat (all of them concatenated; mixed widths allowed) "
                              "or cross (--num_cross_layers cross layers over that concatenation, NVIDIA's DCNv2). "
                              "NVIDIA's dot_custom_cuda and dot_tensorflow mean dot.",
                              choices=[k.value for k in InteractionKind])
    include_diagonal: bool = option(False, "Keep self dot products in the dot interaction.", flag="dot_include_diagonal")
    num_cross_layers: int = option(3, "Cross layers.")
    cross_low_rank: int = option(0, "Rank r of each cross matrix W = U V (0: full rank).")
    top_mlp_dropout: float = option(0.0, "Dropout rate after each hidden layer of the top MLP, in training only (0: none).")
    top_mlp_layer_norm: bool = option(False, "Layer normalization of each hidden layer of the top MLP, before its ReLU.")

    def __post_init__(self):
        object.__setattr__(self, "bottom_mlp_dims", check_widths(self.bottom_mlp_dims, "bottom_mlp_dims"))
        object.__setattr__(self, "top_mlp_dims", check_widths(self.top_mlp_dims, "top_mlp_dims"))
        if self.top_mlp_dims[-1] != 1:
            raise ValueError(f"Expected --top_mlp_dims to end with 1 (the logit). Received: {list(self.top_mlp_dims)}")
        if self.interaction not in [k.value for k in InteractionKind]:
            raise ValueError(f"Expected --interaction in {[k.value for k in InteractionKind]}. Received: {self.interaction!r}")
        check_cross(self.num_cross_layers, self.cross_low_rank)
        object.__setattr__(self, "top_mlp_dropout", check_dropout(self.top_mlp_dropout, "top_mlp_dropout"))


@register
@keras.saving.register_keras_serializable(package="tf_dlrm")
class DLRM(RankingModel):
    """DLRM: ``{"numerical": [b, n_num], feature: ids, ...} -> logits [b, 1]`` (float32).

    Config (:class:`DLRMConfig`): ``bottom_mlp_dims`` (for ``dot`` its last width must equal the
    embedding dim), ``top_mlp_dims`` (the last is 1, the logit), ``top_mlp_dropout`` (dropout after each of its
    hidden layers in training), ``top_mlp_layer_norm`` (layer normalization of them), ``interaction`` (``dot``, ``cat`` or
    ``cross``), ``include_diagonal`` (keep the self dot products of ``dot``), ``num_cross_layers`` and
    ``cross_low_rank`` (``cross``). Without numerical features there is no bottom MLP (``cat`` or ``cross``).
    """

    model_name = "dlrm"
    Config = DLRMConfig

    @classmethod
    def tables(cls, config, deep, crossed=()):
        """The deep tables; refuses, before any table exists, a dot interaction whose bottom MLP does
        not end at the tables' width."""
        widths = sorted({t.embedding_dim for t in deep})
        if config.interaction == InteractionKind.DOT.value and len(widths) == 1 and config.bottom_mlp_dims[-1] != widths[0]:
            raise ValueError(
                "The dot interaction needs the bottom MLP's last width to equal the embedding dim. "
                f"Received: --bottom_mlp_dims={','.join(map(str, config.bottom_mlp_dims))}, --embedding_dim={widths[0]}"
            )
        return list(deep)

    def create_layers(self):
        config, embedding = self.model_config, self.embedding
        dot = config.interaction == InteractionKind.DOT.value
        embedding_dim = embedding.output_dim
        if embedding_dim is None and dot:
            widths = ", ".join(f"{f.name}: table {f.table_name!r} width {w}" for f, w in zip(embedding.output_features, embedding.output_widths))
            raise ValueError(
                "The dot interaction needs one width for every embedding table; use --interaction=cat (or one "
                f"--embedding_dim) for tables of different widths. Received: {widths}"
            )
        if self.num_numerical and dot and config.bottom_mlp_dims[-1] != embedding_dim:
            raise ValueError(
                "The dot interaction needs the bottom MLP's last width to equal the embedding dim. "
                f"Received: bottom_mlp_dims={list(config.bottom_mlp_dims)}, embedding_dim={embedding_dim}"
            )
        if not self.num_numerical and dot:
            raise ValueError("The dot interaction needs numerical features (the bottom MLP output is one of its vectors).")
        self.bottom_mlp = (MLP(config.bottom_mlp_dims, final_activation="relu", seed=self.seed * 2 + 1, name="bottom_mlp")
                           if self.num_numerical else None)
        self.interaction = make_interaction(config.interaction, config.include_diagonal, num_cross_layers=config.num_cross_layers,
                                            cross_low_rank=config.cross_low_rank, seed=self.seed * 2 + 3)
        self.top_mlp = MLP(config.top_mlp_dims, final_activation=None, seed=self.seed * 2 + 2, dropout=config.top_mlp_dropout,
                           layer_norm=config.top_mlp_layer_norm, name="top_mlp")

    def build(self, input_shape=None):
        """Builds every part from the widths the model already knows. Without it Keras builds a
        subclassed model by tracing ``call`` once symbolically, which cost as much as tracing the
        train step."""
        if not self.embedding.built:
            self.embedding.build(None)
        embedding_shape = tuple(self.embedding.compute_output_shape(None))
        bottom_shape = (None, self.model_config.bottom_mlp_dims[-1] if self.bottom_mlp is not None else 0)
        if self.bottom_mlp is not None:
            self.bottom_mlp.build((None, self.num_numerical))
        self.interaction.build((bottom_shape, embedding_shape))
        self.top_mlp.build(tuple(self.interaction.compute_output_shape((bottom_shape, embedding_shape))))

    def dense_call(self, numerical, embeddings, training=None):
        """Bottom MLP, interaction, top MLP: ``embeddings [b, T, D]`` -> logits ``[b, 1]`` (float32)."""
        if self.bottom_mlp is not None:
            bottom = self.bottom_mlp(tf.cast(numerical, self.compute_dtype))
        else:
            bottom = tf.zeros([tf.shape(embeddings)[0], 0], embeddings.dtype)
        interactions = self.interaction((bottom, embeddings))
        # Logits and loss in float32 under mixed precision: the sigmoid saturates early in bf16.
        return tf.cast(self.top_mlp(interactions, training=training), tf.float32)

    def describe(self, xla: bool = False) -> dict[str, dict]:
        """The interaction's implementation in training and evaluation, and why when it falls back."""
        paths = interaction_paths(self.interaction, xla)
        line = (f"interaction: training {paths['training']}, evaluation {paths['evaluation']}"
                + "".join(f"; {reason}" for reason in paths["reasons"]))
        return {"interaction": {**paths, "line": line}}
