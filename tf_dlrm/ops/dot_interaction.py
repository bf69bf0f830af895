"""DLRM's dot interaction through tf_dlrm's kernel (``tf_dlrm/ops/dot_interaction.cc``).

:func:`dot_interaction` is the whole interaction, forward and backward, in one pass per sample over
its ``F x D`` inputs: no ``[B, F, F]`` tensor, gather, transpose or concat. The layer
(:class:`tf_dlrm.models.layers.interaction.DotInteraction`) calls it when :func:`tf_dlrm.ops.kernels`
has loaded and the compute dtype is one of :data:`KERNEL_DTYPES`, and computes the same values with
plain TensorFlow ops otherwise.
"""

from __future__ import annotations

import tensorflow as tf

# The compute dtypes the kernel has (dot_interaction.cc registers float and bfloat16).
KERNEL_DTYPES = (tf.float32, tf.bfloat16)


def dot_interaction(library, bottom: tf.Tensor, embeddings: tf.Tensor, include_diagonal: bool) -> tf.Tensor:
    """``[bottom, tril(X X^T)]`` for ``X = [bottom; embeddings]`` per sample, with the kernel's gradient.

    Args:
        library: the loaded kernel module (:func:`tf_dlrm.ops.kernels`).
        bottom: ``[b, D]``, the bottom MLP's output.
        embeddings: ``[b, F, D]``.
        include_diagonal: keep each vector's dot product with itself.
    """

    @tf.custom_gradient
    def interact(bottom, embeddings):
        out = library.tf_dlrm_dot_interaction(bottom, embeddings, include_diagonal=include_diagonal)

        def backward(upstream):
            return library.tf_dlrm_dot_interaction_grad(bottom, embeddings, upstream, include_diagonal=include_diagonal)

        return out, backward

    return interact(bottom, embeddings)
