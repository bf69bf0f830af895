"""Sparse Adagrad (Duchi et al. 2011), per element, touched rows only.

For each touched row ``r`` with summed gradient ``g``::

    a[r] += g * g
    w[r] -= lr * g / (sqrt(a[r]) + epsilon)

``a`` starts at ``initial_accumulator``. The state ``a`` is ``[rows, width]`` like the variable, so
a column slice holds the accumulators of its own columns and needs nothing from other slices.
"""

from __future__ import annotations

import tensorflow as tf

from tf_dlrm.optimizers.sparse_optimizer import SparseOptimizer, tf_variable


class SparseAdagrad(SparseOptimizer):
    """Args: initial_accumulator (> 0 keeps the first steps bounded), epsilon (>= 0)."""

    name = "adagrad"

    def __init__(self, initial_accumulator: float = 0.1, epsilon: float = 1e-7):
        if initial_accumulator < 0:
            raise ValueError(f"Expected initial_accumulator >= 0. Received: initial_accumulator={initial_accumulator}")
        if epsilon < 0:
            raise ValueError(f"Expected epsilon >= 0. Received: epsilon={epsilon}")
        self.slots = {"accumulator": float(initial_accumulator)}
        self.epsilon = float(epsilon)

    def apply(self, variable, slots, rows, gradient, learning_rate, step, row_mean_squares=None) -> None:
        # One fused kernel per variable; correct here because ``rows`` holds no repeats (summed first).
        tf.raw_ops.ResourceSparseApplyAdagradV2(
            var=tf_variable(variable).handle, accum=slots["accumulator"].handle,
            lr=tf.cast(learning_rate, tf.float32), epsilon=tf.constant(self.epsilon, tf.float32),
            grad=gradient, indices=rows,
        )
