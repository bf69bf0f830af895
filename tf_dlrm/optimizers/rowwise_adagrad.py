"""Row-wise Adagrad (FBGEMM's exact row-wise Adagrad, as TorchRec uses it): one accumulator per row.

For each touched row ``r`` of a table of width ``D`` with summed gradient ``g [D]``::

    a[r] += sum_c g[c]^2 / D          (the row's mean squared gradient)
    w[r] -= lr * g / (sqrt(a[r]) + epsilon)

State is ``[rows, 1]``: ``D`` times smaller than Adagrad's. When a table's columns are cut over
several slices (column-wise sharding), ``sum_c g[c]^2`` spans them all: the trainer sums each
slice's partial sums over the slices of the row (one small allreduce per step, see
:meth:`tf_dlrm.embedding.sparse_update.SparseUpdater.row_mean_squares`) and every slice keeps an
identical copy of the row's accumulator, so N ranks equal one process exactly.
"""

from __future__ import annotations

import tensorflow as tf

from tf_dlrm.optimizers.sparse_adagrad import SparseAdagrad
from tf_dlrm.optimizers.sparse_optimizer import gather, scatter_sub, scatter_update


class SparseRowwiseAdagrad(SparseAdagrad):
    """Adagrad's arguments (initial_accumulator, epsilon); its state is ``[rows, 1]``."""

    name = "rowwise_adagrad"
    row_wise = True

    def apply(self, variable, slots, rows, gradient, learning_rate, step, row_mean_squares=None) -> None:
        if row_mean_squares is None:
            raise ValueError("Row-wise Adagrad needs the mean squared gradient of each whole row (row_mean_squares)")
        accumulator = slots["accumulator"]
        updated = gather(accumulator, rows) + tf.expand_dims(row_mean_squares, 1)  # [U, 1]
        scatter_update(accumulator, rows, updated)
        scatter_sub(variable, rows, tf.cast(learning_rate, tf.float32) * gradient / (tf.sqrt(updated) + self.epsilon))
