"""Adam for sparse tables that catches a row up on the steps it skipped, when it is next touched.

Dense Adam (Keras's ``Adam`` on a ``keras.layers.Embedding``) changes every row at every step: a row
that gets no gradient still has its moments decayed and still moves by its momentum. Lazy Adam
(:mod:`tf_dlrm.optimizers.lazy_adam`) changes touched rows only, so a row seen once moves by one
step where dense Adam keeps moving it for tens of steps. This optimizer keeps lazy Adam's cost
(it reads and writes touched rows only) and, when a row is touched, first applies in closed form the
``k`` steps with zero gradient that dense Adam would have applied since the row was last updated.

Derivation. Let a row be last updated at step ``s`` with moments ``m, v`` and let it be touched
again at step ``t = s + k + 1``. Dense Adam's step ``j`` (learning rate ``lr``) is::

    m_j = b1 m_{j-1} + (1 - b1) g_j,   v_j = b2 v_{j-1} + (1 - b2) g_j^2
    w  -= lr c_j m_j / (sqrt(v_j) + eps),   c_j = sqrt(1 - b2^j) / (1 - b1^j)

With ``g_j = 0`` for ``j = s+1 .. s+k`` (write ``i = j - s``): ``m_j = b1^i m``, ``v_j = b2^i v``, and
``sqrt(v_j) = b2^(i/2) sqrt(v)``, so the ``k`` skipped steps move the row by::

    sum_{i=1..k} lr c_{s+i} b1^i m / (b2^(i/2) sqrt(v) + eps)
      ~= lr m / (sqrt(v) + eps) * sum_{i=1..k} c_{s+i} r^i,          r = b1 / sqrt(b2)

The one approximation replaces ``eps`` by ``eps b2^(i/2)`` in the i-th term (dividing numerator and
denominator by ``b2^(i/2)``): the relative change of a term is below ``eps (b2^(-i/2) - 1) / sqrt(v)``,
which is nothing unless ``sqrt(v)`` is near ``eps``, and the terms themselves fall as ``r^i``. The
scalar sum ``S(s, k) = sum_{i=1..k} c_{s+i} r^i`` is a difference of two tails
``Q(n) = sum_{i>=1} c_{n+i} r^i``::

    S(s, k) = Q(s) - r^k Q(s + k),       Q(n) = r (c_{n+1} + Q(n + 1))

``c_n`` tends to 1 (``b1^n``, ``b2^n`` -> 0), so ``Q(n) = r / (1 - r)`` for all ``n`` from some ``N`` on
(the first ``n`` where ``b2^n / 2`` is below float64's resolution); ``Q`` is computed once, backward from
``N``, into a table of ``N + 1`` values, and each touched row costs two lookups in it. After the
catch-up the moments are ``b1^k m`` and ``b2^k v``, and the row takes the ordinary Adam step of step
``t`` with its gradient. The result equals ``k`` explicit zero-gradient dense Adam steps followed by
one with the gradient (tested against that in numpy), up to the ``eps`` term above and float32
rounding.

What stays different from dense Adam: the catch-up uses the current learning rate for the skipped
steps (exact under a constant schedule, tf_dlrm's default); a row's pending moves are applied when it
is next touched, so a lookup sees the row as it was at its last update (dense Adam's lookup would see
it moved); and rows never touched again keep their pending moves. Per row the step of its last update
is kept (slot ``last_step``, float32, exact up to ``2^24`` steps; beyond, ``k`` may be off by a few
steps, whose weight ``r^k`` is then negligible). The slot has the variable's width so that a column
slice carries its own copy (every state slot of a non-row-wise optimizer has that shape). With
``--hot_row_sync_every`` > 1 a merge adds up every rank's change of ``last_step`` like any state, so a
row several ranks touched gets a ``last_step`` past the current step: its next catch-up is then empty
(``k`` is clamped at 0) and it moves as under lazy Adam; with the default of 1 hot rows are exact.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from tf_dlrm.optimizers.settings import check_adam_arguments
from tf_dlrm.ops.embedding_bag import bag_kernel
from tf_dlrm.optimizers.sparse_optimizer import SparseOptimizer, gather, scatter_sub, scatter_update, tf_variable

# Q is tabulated up to the step where c_n equals 1 in float64; a beta_2 that close to 1 would need a
# longer table than is worth holding, so the table stops here (c_n is then within 1e-6 of 1 for
# beta_2 <= 0.99999).
MAX_TABLE_STEPS = 1 << 20


def skipped_step_tails(beta_1: float, beta_2: float, max_steps: int = MAX_TABLE_STEPS) -> np.ndarray:
    """``Q(n) = sum_{i>=1} c_{n+i} r^i`` for ``n = 0 .. N`` (float64), ``Q(N) = r / (1 - r)`` (``c = 1``).

    ``c_j = sqrt(1 - beta_2^j) / (1 - beta_1^j)`` and ``r = beta_1 / sqrt(beta_2)``; ``N`` is the first
    step where ``1 - c_j`` is below float64's resolution (at most ``max_steps``).
    """
    ratio = beta_1 / math.sqrt(beta_2)
    slowest = max(beta_1, beta_2)
    last = 1 if slowest == 0.0 else min(max_steps, int(math.ceil(math.log(np.finfo(np.float64).eps) / math.log(slowest))) + 1)
    steps = np.arange(1, last + 1, dtype=np.float64)
    bias = np.sqrt(1.0 - beta_2**steps) / (1.0 - beta_1**steps)  # c_1 .. c_N
    tails = np.empty(last + 1, dtype=np.float64)
    tails[last] = ratio / (1.0 - ratio)
    for n in range(last - 1, -1, -1):
        tails[n] = ratio * (bias[n] + tails[n + 1])  # bias[n] is c_{n+1}
    return tails


class SparseCatchUpAdam(SparseOptimizer):
    """Adam on touched rows, each first caught up on the zero-gradient steps it skipped.

    Args: beta_1, beta_2 (in [0, 1)), epsilon (> 0).
    """

    name = "catch_up_adam"
    slots = {"m": 0.0, "v": 0.0, "last_step": 0.0}

    def __init__(self, beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-8):
        check_adam_arguments(beta_1, beta_2, epsilon)
        if not beta_1 < math.sqrt(beta_2):
            # The skipped steps' moves fall as (beta_1 / sqrt(beta_2))^i: their sum is finite only below 1.
            raise ValueError(f"Expected beta_1 < sqrt(beta_2) for catch_up_adam. Received: beta_1={beta_1}, beta_2={beta_2}")
        self.beta_1, self.beta_2, self.epsilon = float(beta_1), float(beta_2), float(epsilon)
        self.ratio = self.beta_1 / math.sqrt(self.beta_2)
        self._tails_values = skipped_step_tails(self.beta_1, self.beta_2)

    def tails(self) -> tf.Tensor:
        # A new constant per call: a tensor kept from one traced function cannot be used in another.
        return tf.constant(self._tails_values, tf.float64)

    def skipped_sum(self, last_step: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
        """``S(s, k)`` for rows last updated at ``last_step`` [U] (float64), touched at ``step``."""
        tails = self.tails()
        end = tf.cast(tf.shape(tails)[0] - 1, tf.float64)
        skipped = tf.maximum(step - 1.0 - last_step, 0.0)

        def tail(n):
            return tf.gather(tails, tf.cast(tf.minimum(n, end), tf.int64))

        return tail(last_step) - tf.pow(tf.constant(self.ratio, tf.float64), skipped) * tail(last_step + skipped)

    def apply(self, variable, slots, rows, gradient, learning_rate, step, row_mean_squares=None) -> None:
        t = tf.cast(step, tf.float64)
        rate = tf.cast(learning_rate, tf.float64)
        alpha = tf.cast(rate * tf.sqrt(1.0 - self.beta_2**t) / (1.0 - self.beta_1**t), tf.float32)
        library = bag_kernel()
        if library is not None:
            # ``rows`` are distinct (the caller summed repeated ids): one pass over the table, both
            # moments and last_step on all threads, each row's catch-up computed from its own
            # last_step; the ops below are the fallback without the library.
            logs = [math.log(self.beta_1) if self.beta_1 else -math.inf, math.log(self.beta_2),
                    math.log(self.ratio) if self.ratio else -math.inf]
            library.tf_dlrm_sparse_apply_catch_up_adam(
                table=tf_variable(variable).handle, m=tf_variable(slots["m"]).handle, v=tf_variable(slots["v"]).handle,
                last_step=tf_variable(slots["last_step"]).handle, rows=rows, gradient=gradient, alpha=alpha, step=t,
                tails=self.tails(), constants=tf.concat([tf.constant(logs, tf.float64), tf.reshape(rate, [1])], axis=0),
                beta_1=self.beta_1, beta_2=self.beta_2, one_minus_beta_1=1.0 - self.beta_1,
                one_minus_beta_2=1.0 - self.beta_2, epsilon=self.epsilon)
            return
        # Every column of a row's last_step holds the same value: read one.
        first_column = tf.stack([tf.cast(rows, tf.int64), tf.zeros_like(rows, tf.int64)], axis=1)
        last = tf.cast(tf_variable(slots["last_step"]).gather_nd(first_column), tf.float64)  # [U]
        skipped = tf.maximum(t - 1.0 - last, 0.0)
        # A row never touched has no momentum to catch up on.
        catch_up = tf.cast(tf.where(last > 0.0, rate * self.skipped_sum(last, t), 0.0), tf.float32)[:, None]
        decay_1 = tf.cast(tf.pow(tf.constant(self.beta_1, tf.float64), skipped), tf.float32)[:, None]
        decay_2 = tf.cast(tf.pow(tf.constant(self.beta_2, tf.float64), skipped), tf.float32)[:, None]
        m0, v0 = gather(slots["m"], rows), gather(slots["v"], rows)
        moved = catch_up * m0 / (tf.sqrt(v0) + self.epsilon)
        m = self.beta_1 * decay_1 * m0 + (1.0 - self.beta_1) * gradient
        v = self.beta_2 * decay_2 * v0 + (1.0 - self.beta_2) * tf.square(gradient)
        scatter_update(slots["m"], rows, m)
        scatter_update(slots["v"], rows, v)
        scatter_update(slots["last_step"], rows, tf.fill(tf.shape(m), tf.cast(t, tf.float32)))
        scatter_sub(variable, rows, moved + alpha * m / (tf.sqrt(v) + self.epsilon))
