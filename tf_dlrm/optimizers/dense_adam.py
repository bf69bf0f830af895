"""Adam that updates the whole table at every step, as Keras's ``Adam`` does on a plain embedding.

Every row's moments decay at every step and every row moves by its momentum, touched or not: the
semantics of dense Adam, for tables small enough that reading and writing all their rows each step
costs little next to the rest of the step. The touched rows' summed gradients are scattered into a
zero ``[rows, width]`` gradient and the ordinary Adam update runs on the whole variable::

    m = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2,   w -= lr sqrt(1 - b2^t) / (1 - b1^t) m / (sqrt(v) + eps)

An L2 weight decay ``wd`` (``--embedding_weight_decay``) is added to the gradient of every row, ``g + wd w``,
as Keras's Adam gets it from an L2 term of the loss over the whole table: a row not seen for many steps has a
small ``v``, so the decay alone moves it toward zero by up to the learning rate per step (the other sparse
optimizers add it to the touched rows only).

For large tables use :mod:`tf_dlrm.optimizers.catch_up_adam`, which applies the same zero-gradient
steps to a row only when it is next touched. Split bfloat16 tables (``--split_embedding_tables``) run
the optimizer on a scratch copy of the touched rows only, where this is lazy Adam: use catch-up Adam
there.
"""

from __future__ import annotations

import tensorflow as tf

from tf_dlrm.optimizers.settings import check_adam_arguments
from tf_dlrm.optimizers.sparse_optimizer import SparseOptimizer, tf_variable


class SparseDenseAdam(SparseOptimizer):
    """Args: beta_1, beta_2 (in [0, 1)), epsilon (> 0)."""

    name = "dense_adam"
    slots = {"m": 0.0, "v": 0.0}
    decays_every_row = True

    def __init__(self, beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-8):
        check_adam_arguments(beta_1, beta_2, epsilon)
        self.beta_1, self.beta_2, self.epsilon = float(beta_1), float(beta_2), float(epsilon)

    def apply(self, variable, slots, rows, gradient, learning_rate, step, row_mean_squares=None, weight_decay: float = 0.0) -> None:
        table, m_slot, v_slot = tf_variable(variable), tf_variable(slots["m"]), tf_variable(slots["v"])
        dense = tf.scatter_nd(tf.expand_dims(tf.cast(rows, tf.int64), 1), gradient, tf.shape(table, out_type=tf.int64))
        if weight_decay:
            dense += weight_decay * table.read_value()
        t = tf.cast(step, tf.float32)
        alpha = tf.cast(learning_rate, tf.float32) * tf.sqrt(1.0 - self.beta_2**t) / (1.0 - self.beta_1**t)
        m = m_slot.assign(self.beta_1 * m_slot + (1.0 - self.beta_1) * dense)
        v = v_slot.assign(self.beta_2 * v_slot + (1.0 - self.beta_2) * tf.square(dense))
        table.assign_sub(alpha * m / (tf.sqrt(v) + self.epsilon))
