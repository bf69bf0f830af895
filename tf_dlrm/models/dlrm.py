"""The DLRM Keras model: bottom MLP, embeddings, interaction, top MLP, one logit."""

from __future__ import annotations

from typing import Sequence

import keras
import tensorflow as tf

from tf_dlrm.models.layers.interaction import InteractionKind, make_interaction
from tf_dlrm.models.layers.mlp import MLP


@keras.saving.register_keras_serializable(package="tf_dlrm")
class DLRM(keras.Model):
    """DLRM over ``(numerical [b, n_num], categorical tuple) -> logits [b, 1]`` (float32).

    Args:
        embedding: an embedding layer following the interface of :mod:`tf_dlrm.embedding.embedding_bank`.
        num_numerical: numerical features per sample (0: no bottom MLP).
        bottom_mlp_dims: widths of the bottom MLP; for ``dot`` its last width must equal the
            embedding dim.
        top_mlp_dims: widths of the top MLP; the last must be 1 (the logit).
        interaction: ``"dot"`` or ``"cat"``.
        include_diagonal: keep the self dot products in the ``dot`` interaction.
        seed: seed of the MLP initialisers.
    """

    def __init__(
        self,
        embedding: keras.layers.Layer,
        num_numerical: int,
        bottom_mlp_dims: Sequence[int],
        top_mlp_dims: Sequence[int],
        interaction: str = "dot",
        include_diagonal: bool = False,
        seed: int = 0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.top_mlp_dims = tuple(int(d) for d in top_mlp_dims)
        self.bottom_mlp_dims = tuple(int(d) for d in bottom_mlp_dims)
        if not self.top_mlp_dims or self.top_mlp_dims[-1] != 1:
            raise ValueError(f"Expected the top MLP to end in one unit (the logit). Received: top_mlp_dims={list(self.top_mlp_dims)}")
        self.num_numerical = int(num_numerical)
        self.interaction_kind = InteractionKind(interaction).value
        embedding_dim = embedding.embedding_dim
        if embedding_dim is None and self.interaction_kind == "dot":
            widths = ", ".join(f"{f.name}: table {f.table_name!r} width {w}" for f, w in zip(embedding.features, embedding.feature_widths))
            raise ValueError(
                "The dot interaction needs one width for every embedding table; use --interaction=cat (or one "
                f"--embedding_dim) for tables of different widths. Received: {widths}"
            )
        if self.num_numerical and self.interaction_kind == "dot" and self.bottom_mlp_dims[-1] != embedding_dim:
            raise ValueError(
                "The dot interaction needs the bottom MLP's last width to equal the embedding dim. "
                f"Received: bottom_mlp_dims={list(self.bottom_mlp_dims)}, embedding_dim={embedding_dim}"
            )
        if not self.num_numerical and self.interaction_kind == "dot":
            raise ValueError("The dot interaction needs numerical features (the bottom MLP output is one of its vectors).")
        self.include_diagonal = bool(include_diagonal)
        self.seed = int(seed)
        self.embedding = embedding
        self.bottom_mlp = MLP(self.bottom_mlp_dims, final_activation="relu", seed=seed * 2 + 1, name="bottom_mlp") if self.num_numerical else None
        self.interaction = make_interaction(self.interaction_kind, self.include_diagonal)
        self.top_mlp = MLP(self.top_mlp_dims, final_activation=None, seed=seed * 2 + 2, name="top_mlp")

    def build(self, input_shape=None):
        """Builds every part from the widths the model already knows. Without it Keras builds a
        subclassed model by tracing ``call`` once symbolically, which costs as much as tracing the
        train step."""
        if not self.embedding.built:
            self.embedding.build(None)
        embedding_shape = tuple(self.embedding.compute_output_shape(None))
        bottom_shape = (None, self.bottom_mlp_dims[-1] if self.bottom_mlp is not None else 0)
        if self.bottom_mlp is not None:
            self.bottom_mlp.build((None, self.num_numerical))
        self.interaction.build((bottom_shape, embedding_shape))
        self.top_mlp.build(tuple(self.interaction.compute_output_shape((bottom_shape, embedding_shape))))

    def call(self, inputs, training=False):
        numerical, categorical = inputs
        embeddings = self.embedding(categorical, local_batch=tf.shape(numerical)[0])
        return self.dense_call(numerical, embeddings)

    def dense_call(self, numerical, embeddings):
        """Everything after the embedding lookup (the data-parallel part): bottom MLP, interaction,
        top MLP; ``embeddings [b, T, D]`` -> logits ``[b, 1]`` (float32). The XLA path compiles this."""
        if self.bottom_mlp is not None:
            bottom = self.bottom_mlp(tf.cast(numerical, self.compute_dtype))
        else:
            bottom = tf.zeros([tf.shape(embeddings)[0], 0], embeddings.dtype)
        interactions = self.interaction((bottom, embeddings))
        # Logits and loss in float32 under mixed precision: the sigmoid saturates early in bf16.
        return tf.cast(self.top_mlp(interactions), tf.float32)

    @property
    def mlp_variables(self) -> list:
        """The bottom and top MLP weights (data-parallel, optimised by the dense optimizer)."""
        mlps = [layer for layer in (self.bottom_mlp, self.top_mlp) if layer is not None]
        return [v for layer in mlps for v in layer.trainable_variables]

    def get_config(self):
        return {
            **super().get_config(),
            "embedding": keras.saving.serialize_keras_object(self.embedding),
            "num_numerical": self.num_numerical,
            "bottom_mlp_dims": list(self.bottom_mlp_dims),
            "top_mlp_dims": list(self.top_mlp_dims),
            "interaction": self.interaction_kind,
            "include_diagonal": self.include_diagonal,
            "seed": self.seed,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["embedding"] = keras.saving.deserialize_keras_object(config["embedding"])
        return cls(**config)
