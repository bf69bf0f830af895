"""Sparse FTRL-Proximal (McMahan et al. 2013, "Ad Click Prediction: a View from the Trenches",
algorithm 1), per element, touched rows only; the optimizer the Wide & Deep paper used for its
wide part.

For each touched row ``r`` with summed gradient ``g`` (TensorFlow's ``Ftrl`` formulation, learning
rate power -1/2)::

    n_new = n[r] + g^2
    z[r] += g - (sqrt(n_new) - sqrt(n[r])) / lr * w[r]
    n[r] = n_new
    w[r] = 0                                                 if |z[r]| <= l1
         = (sign(z[r]) * l1 - z[r]) / (sqrt(n_new) / lr + 2 * l2)   otherwise

``n`` starts at ``initial_accumulator`` (> 0), ``z`` at 0. With ``l1 > 0`` rare ids' weights stay
exactly zero: the sparse linear models FTRL is known for. The state is ``[rows, width]`` like the
variable, so a column slice holds its own columns'.
"""

from __future__ import annotations

import tensorflow as tf

from tf_dlrm.optimizers.sparse_optimizer import SparseOptimizer, tf_variable


class SparseFtrl(SparseOptimizer):
    """Args: initial_accumulator (> 0), l1 and l2 (>= 0) regularisation strengths."""

    name = "ftrl"

    def __init__(self, initial_accumulator: float = 0.1, l1: float = 0.0, l2: float = 0.0):
        if initial_accumulator <= 0:
            raise ValueError(f"Expected initial_accumulator > 0. Received: initial_accumulator={initial_accumulator}")
        for name, value in (("l1", l1), ("l2", l2)):
            if value < 0:
                raise ValueError(f"Expected {name} >= 0. Received: {name}={value}")
        self.slots = {"accumulator": float(initial_accumulator), "linear": 0.0}
        self.l1, self.l2 = float(l1), float(l2)

    def apply(self, variable, slots, rows, gradient, learning_rate, step, row_mean_squares=None) -> None:
        # One fused kernel; correct here because ``rows`` holds no repeats (summed first).
        tf.raw_ops.ResourceSparseApplyFtrl(
            var=tf_variable(variable).handle, accum=slots["accumulator"].handle, linear=slots["linear"].handle,
            grad=gradient, indices=rows, lr=tf.cast(learning_rate, tf.float32), l1=tf.constant(self.l1, tf.float32),
            l2=tf.constant(self.l2, tf.float32), lr_power=tf.constant(-0.5, tf.float32),
        )
