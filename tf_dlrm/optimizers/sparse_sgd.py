"""Sparse SGD: ``w[r] -= lr * g[r]`` for the touched rows."""

from __future__ import annotations

import tensorflow as tf

from tf_dlrm.ops.embedding_bag import apply_sgd_to_repeated_rows, bag_kernel
from tf_dlrm.optimizers.sparse_optimizer import SparseOptimizer, tf_variable


class SparseSGD(SparseOptimizer):
    """Stateless; repeated ids need no summing first (the update is linear), so the trainer may
    call :meth:`apply_repeated` on the raw gradient and skip :func:`deduplicate`."""

    name = "sgd"
    slots: dict[str, float] = {}

    def apply(self, variable, slots, rows, gradient, learning_rate, step, row_mean_squares=None) -> None:
        self.apply_repeated(variable, tf.IndexedSlices(gradient, rows), learning_rate)

    @staticmethod
    def apply_repeated(variable, gradient: tf.IndexedSlices, learning_rate) -> None:
        """``variable[indices] -= learning_rate * values``, repeated indices applied one after another
        in their order.

        With tf_dlrm's kernel library, one multi-threaded pass (each thread its own columns). Without
        it, TensorFlow's proximal-SGD kernel with zero L1 and L2, which is exactly this update
        (``prox / (1 + 0)``) in one single-threaded pass, where ``scatter_sub`` would need a scaled
        copy of the values first (and TensorFlow 2.21 runs both several times slower than 2.18 did).
        """
        if bag_kernel() is not None and gradient.values.dtype in (tf.float32, tf.bfloat16):
            apply_sgd_to_repeated_rows(variable, gradient, learning_rate)
            return
        gradient = tf.IndexedSlices(tf.cast(gradient.values, variable.dtype), gradient.indices, gradient.dense_shape)
        zero = tf.zeros([], gradient.values.dtype)
        tf.raw_ops.ResourceSparseApplyProximalGradientDescent(
            var=tf_variable(variable).handle, alpha=tf.cast(learning_rate, gradient.values.dtype), l1=zero, l2=zero,
            grad=gradient.values, indices=gradient.indices,
        )
