"""Feature interactions of DLRM: pairwise dot products (``dot``), plain concatenation (``cat``), or cross
layers over the concatenation (``cross``: NVIDIA's DCNv2, DLRM-DCNv2 of MLPerf)."""

from __future__ import annotations

import enum

import keras
import numpy as np
import tensorflow as tf

from tf_dlrm.models.layers.cross_network import CrossNetwork
from tf_dlrm.ops import kernels
from tf_dlrm.ops.dot_interaction import KERNEL_DTYPES, dot_interaction


class InteractionKind(str, enum.Enum):
    DOT = "dot"
    CAT = "cat"
    CROSS = "cross"


def lower_triangle_indices(num_vectors: int, include_diagonal: bool) -> np.ndarray:
    """Flat indices ``i * F + j`` of the pairs ``j < i`` (or ``j <= i``), row by row."""
    rows, cols = np.tril_indices(num_vectors, k=0 if include_diagonal else -1)
    return (rows * num_vectors + cols).astype(np.int32)


@keras.saving.register_keras_serializable(package="tf_dlrm")
class DotInteraction(keras.layers.Layer):
    """Dot interaction: all pairwise dot products of the bottom-MLP output and the embeddings.

    With ``X = [bottom; e_1; ...; e_T]`` of shape ``[B, F, D]`` (``F = T + 1``), computes
    ``Z = X X^T`` with one batched matmul and keeps its strict lower triangle (``i > j``), or the lower
    triangle with the diagonal, with one gather; the output is ``[bottom, tril(Z)]`` of width
    ``D + F (F - 1) / 2`` (``D + F (F + 1) / 2`` with the diagonal). Reference: Naumov et al. 2019,
    "Deep Learning Recommendation Model for Personalization and Recommendation Systems".
    """

    def __init__(self, include_diagonal: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.include_diagonal = bool(include_diagonal)
        # tf_dlrm's CPU kernel (tf_dlrm/ops) computes the products and their gradient in float32
        # (bfloat16 inputs are widened, outputs rounded once) when it is built; XLA cannot compile
        # it, so the XLA step traces the compiled function inside tf_dlrm.ops.kernels_off.
        self.use_kernel = True

    def build(self, input_shapes):
        bottom_shape, embedding_shape = input_shapes
        if bottom_shape[-1] != embedding_shape[-1]:
            raise ValueError(
                "The dot interaction needs the bottom MLP's last width to equal the embedding dim. "
                f"Received: bottom MLP width={bottom_shape[-1]}, embedding_dim={embedding_shape[-1]}"
            )
        self.num_vectors = int(embedding_shape[1]) + 1
        self.pair_indices = lower_triangle_indices(self.num_vectors, self.include_diagonal)
        # For the backward pass: entry (i, j) of the F x F gradient reads pair (i, j) or (j, i),
        # whichever is kept; entries of no pair read an appended zero column.
        count = self.num_vectors
        sources = np.full(count * count, len(self.pair_indices), dtype=np.int32)
        sources[self.pair_indices] = np.arange(len(self.pair_indices), dtype=np.int32)
        rows, cols = np.divmod(self.pair_indices, count)
        sources[cols * count + rows] = np.arange(len(self.pair_indices), dtype=np.int32)
        self.symmetric_sources = sources

    def call(self, inputs):
        bottom, embeddings = inputs
        library = kernels() if self.use_kernel and bottom.dtype in KERNEL_DTYPES else None
        if library is not None:
            return dot_interaction(library, bottom, embeddings, self.include_diagonal)
        vectors = tf.concat([tf.expand_dims(bottom, 1), embeddings], axis=1)
        return tf.concat([bottom, self._generic_pairwise_dots(vectors)], axis=1)

    def _generic_pairwise_dots(self, vectors):
        """``tril(X X^T)`` flattened, with a hand-written gradient: for ``Z = X X^T`` the gradient is
        ``(G + G^T) X`` where ``G`` holds the upstream gradient at the kept pairs: one gather builds
        ``G + G^T`` and one batched matmul finishes, instead of the generic two matmuls and a
        segment sum."""
        count = self.num_vectors

        @tf.custom_gradient
        def pairwise(vectors):
            products = tf.matmul(vectors, vectors, transpose_b=True)
            pairs = tf.gather(tf.reshape(products, [-1, count * count]), self.pair_indices, axis=1)

            def backward(upstream):
                # Gathering whole rows of the transposed gradient reads memory contiguously, where
                # gathering single elements along axis 1 does not (the transposes are cheap in oneDNN).
                columns = tf.transpose(upstream)  # [pairs, b]
                columns = tf.concat([columns, tf.zeros_like(columns[:1])], axis=0)
                symmetric = tf.transpose(tf.gather(columns, self.symmetric_sources))  # [b, F * F]
                if self.include_diagonal:  # d(x_i . x_i) / d x_i = 2 x_i
                    symmetric = symmetric * tf.constant(1.0 + np.eye(count).reshape(-1), symmetric.dtype)
                return tf.matmul(tf.reshape(symmetric, [-1, count, count]), vectors)

            return pairs, backward

        return pairwise(vectors)

    def compute_output_shape(self, input_shapes):
        bottom_shape, embedding_shape = input_shapes
        count = int(embedding_shape[1]) + 1
        pairs = count * (count + 1) // 2 if self.include_diagonal else count * (count - 1) // 2
        return (bottom_shape[0], bottom_shape[-1] + pairs)

    def get_config(self):
        return {**super().get_config(), "include_diagonal": self.include_diagonal}


@keras.saving.register_keras_serializable(package="tf_dlrm")
class CatInteraction(keras.layers.Layer):
    """Concatenation of the bottom-MLP output and all embeddings: ``[B, D_bottom + T * D]``.

    The embeddings may also come flat, ``[B, sum of widths]`` (tables of different widths)."""

    def call(self, inputs):
        bottom, embeddings = inputs
        flat = embeddings if embeddings.shape.rank == 2 else tf.reshape(embeddings, [-1, embeddings.shape[1] * embeddings.shape[2]])
        return tf.concat([bottom, flat], axis=1)

    def compute_output_shape(self, input_shapes):
        bottom_shape, embedding_shape = input_shapes
        width = embedding_shape[1] if len(embedding_shape) == 2 else embedding_shape[1] * embedding_shape[2]
        return (bottom_shape[0], bottom_shape[-1] + width)


@keras.saving.register_keras_serializable(package="tf_dlrm")
class CrossInteraction(keras.layers.Layer):
    """A cross network (:class:`tf_dlrm.models.layers.cross_network.CrossNetwork`) over the concatenation of the
    bottom-MLP output and all embeddings: ``[B, D_bottom + sum of widths]``, the width kept. The interaction of
    NVIDIA's DCNv2 (DeepLearningExamples' ``dcnv2.py``), where the cross layers see the numerical features through
    the bottom MLP, unlike :class:`tf_dlrm.models.dcnv2.DCNv2` (raw numerical features, a deep MLP beside)."""

    def __init__(self, num_layers: int, low_rank: int = 0, seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.num_layers, self.low_rank, self.seed = num_layers, low_rank, int(seed)
        self.concat = CatInteraction(dtype=self.dtype_policy, name="concat")
        self.cross_network = CrossNetwork(num_layers, low_rank, seed=seed, dtype=self.dtype_policy, name="cross_network")

    def build(self, input_shapes):
        self.cross_network.build(self.concat.compute_output_shape(input_shapes))

    def call(self, inputs):
        return self.cross_network(self.concat(inputs))

    def compute_output_shape(self, input_shapes):
        return self.concat.compute_output_shape(input_shapes)

    def get_config(self):
        return {**super().get_config(), "num_layers": self.num_layers, "low_rank": self.low_rank, "seed": self.seed}


def interaction_paths(layer, xla: bool) -> dict:
    """Which implementation a model's interaction runs, in training and in evaluation, and why a
    slower one when it falls back: ``{"training": ..., "evaluation": ..., "reasons": [...]}`` with
    paths ``kernel_fp32``, ``kernel_bf16``, ``plain_tf``, ``plain_tf_in_xla``, ``cat`` or the class name of another model's interaction."""
    if not isinstance(layer, DotInteraction):
        # DLRM's cat, or another model's own interaction (a cross network, an FM term): plain TF.
        name = "cat" if isinstance(layer, CatInteraction) else type(layer).__name__
        return {"training": name, "evaluation": name, "reasons": []}
    from tf_dlrm.ops import unavailable_reason

    reasons = []
    dtype = tf.as_dtype(layer.compute_dtype)
    missing = unavailable_reason() if layer.use_kernel else "the layer's use_kernel is off"
    if missing:
        reasons.append(missing)
        path = "plain_tf"
    elif dtype not in KERNEL_DTYPES:
        reasons.append(f"the kernel has no {dtype.name} path (float32 and bfloat16 only)")
        path = "plain_tf"
    else:
        path = "kernel_fp32" if dtype == tf.float32 else "kernel_bf16"
    training = path
    if xla:
        training = "plain_tf_in_xla"
        reasons.append("--xla: XLA compiles TensorFlow's own ops only, so the compiled training step uses "
                       "the plain TensorFlow interaction (evaluation is not compiled and keeps "
                       f"{path})")
    return {"training": training, "evaluation": path, "reasons": reasons}


def make_interaction(kind: str, include_diagonal: bool = False, dtype=None, num_cross_layers: int = 3,
                     cross_low_rank: int = 0, seed: int = 0) -> keras.layers.Layer:
    try:
        kind = InteractionKind(kind)
    except ValueError:
        raise ValueError(
            f"Expected interaction in {[k.value for k in InteractionKind]}. Received: interaction={kind!r}"
        ) from None
    if kind is InteractionKind.DOT:
        return DotInteraction(include_diagonal=include_diagonal, dtype=dtype, name="interaction")
    if kind is InteractionKind.CROSS:
        return CrossInteraction(num_cross_layers, cross_low_rank, seed=seed, dtype=dtype, name="interaction")
    return CatInteraction(dtype=dtype, name="interaction")
