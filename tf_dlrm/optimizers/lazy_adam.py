"""Lazy Adam (Kingma & Ba 2015, applied to touched rows only, as TF Addons' LazyAdam).

For each touched row ``r`` with summed gradient ``g``, at the ``t``-th step of training::

    m[r] = beta1 * m[r] + (1 - beta1) * g
    v[r] = beta2 * v[r] + (1 - beta2) * g^2
    w[r] -= lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m[r] / (sqrt(v[r]) + epsilon)

Untouched rows keep their moments (they are not decayed): the state of a row changes only in the
steps that see it. ``m`` and ``v`` are ``[rows, width]``, so a column slice holds its own columns'.
"""

from __future__ import annotations

import tensorflow as tf

from tf_dlrm.optimizers.settings import check_adam_arguments
from tf_dlrm.ops.embedding_bag import apply_lazy_adam_to_distinct_rows
from tf_dlrm.optimizers.sparse_optimizer import SparseOptimizer, gather, scatter_sub, scatter_update


class SparseLazyAdam(SparseOptimizer):
    """Args: beta_1, beta_2 (in [0, 1)), epsilon (> 0)."""

    name = "lazy_adam"
    slots = {"m": 0.0, "v": 0.0}

    def __init__(self, beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-8):
        check_adam_arguments(beta_1, beta_2, epsilon)
        self.beta_1, self.beta_2, self.epsilon = float(beta_1), float(beta_2), float(epsilon)

    def apply(self, variable, slots, rows, gradient, learning_rate, step, row_mean_squares=None) -> None:
        t = tf.cast(step, tf.float32)
        alpha = tf.cast(learning_rate, tf.float32) * tf.sqrt(1.0 - self.beta_2**t) / (1.0 - self.beta_1**t)
        # ``rows`` are distinct (the caller summed repeated ids): tf_dlrm's kernel updates the table
        # and both moments in one pass on all threads; the ops below (two gathers, three scatters)
        # are the fallback without the kernel library.
        if apply_lazy_adam_to_distinct_rows(variable, slots["m"], slots["v"], rows, gradient, alpha,
                                            self.beta_1, self.beta_2, self.epsilon):
            return
        m = self.beta_1 * gather(slots["m"], rows) + (1.0 - self.beta_1) * gradient
        v = self.beta_2 * gather(slots["v"], rows) + (1.0 - self.beta_2) * tf.square(gradient)
        scatter_update(slots["m"], rows, m)
        scatter_update(slots["v"], rows, v)
        scatter_sub(variable, rows, alpha * m / (tf.sqrt(v) + self.epsilon))
