"""The float32 update of a split bfloat16 table (:mod:`tf_dlrm.embedding.split_tables`).

Every sparse optimizer here updates a float32 variable in place (TensorFlow's fused kernels, tf_dlrm's
lazy Adam kernel, or gathers and scatters). For a split table the touched rows are first put back
together in float32 (both halves gathered and joined bit-exactly) into a small scratch variable of
``[touched rows, width]``, with the rows' optimizer state beside it; the optimizer then runs
**unchanged** on the scratch (rows ``0..U-1``), and the results are split and scattered back. So the
arithmetic of the update is the optimizer's own float32 arithmetic, bit for bit; the cost is one
extra copy of the touched rows and their state, never of the table.
"""

from __future__ import annotations

import tensorflow as tf

from tf_dlrm.embedding.split_tables import gather_float32, scatter_float32
from tf_dlrm.optimizers.sparse_optimizer import SparseOptimizer
from tf_dlrm.optimizers.sparse_sgd import SparseSGD


def float32_gradient(gradient):
    """A bf16 table's gradient (``IndexedSlices`` of bfloat16 values) in float32: repeated ids are
    then summed in float32, as for a float32 table read through a cast to bfloat16."""
    if isinstance(gradient, tf.IndexedSlices):
        if gradient.values.dtype == tf.float32:
            return gradient
        return tf.IndexedSlices(tf.cast(gradient.values, tf.float32), gradient.indices, gradient.dense_shape)
    return tf.cast(gradient, tf.float32)


class SplitTableUpdate:
    """Scratch space and the update of one split table.

    Args:
        variable: the split table's ``high`` (bfloat16) variable, marked with its ``low`` partner.
        state: every optimizer state variable of this table (``[rows, width]`` or ``[rows, 1]``).
    """

    def __init__(self, variable, state=()):
        self.variable = variable
        width = int(variable.shape[1])
        base = variable.path.replace("/", "_") if hasattr(variable, "path") else variable.name.replace(":", "_")
        self.rows = tf.Variable(tf.zeros([0, width], tf.float32), shape=tf.TensorShape([None, width]), trainable=False,
                                name=f"{base}_split_rows")
        # Keyed by the state variable: the state of every optimizer group of the table gets its own.
        self.state = {slot.ref(): tf.Variable(tf.zeros([0, int(slot.shape[1])], slot.dtype),
                                              shape=tf.TensorShape([None, int(slot.shape[1])]), trainable=False,
                                              name=f"{base}_split_state_{index}")
                      for index, slot in enumerate(state)}

    def apply(self, optimizer: SparseOptimizer, slots: dict, rows, gradient, learning_rate, step, row_mean_squares=None) -> None:
        """``optimizer.apply`` on the distinct ``rows`` of the table, in float32 (see the module doc)."""
        self.rows.assign(gather_float32(self.variable, rows))
        compact = {}
        for name, slot in slots.items():
            scratch = self.state[slot.ref()]
            scratch.assign(tf.gather(slot, rows))
            compact[name] = scratch
        positions = tf.range(tf.shape(rows, out_type=rows.dtype)[0], dtype=rows.dtype)
        optimizer.apply(self.rows, compact, positions, gradient, learning_rate, step, row_mean_squares=row_mean_squares)
        scatter_float32(self.variable, rows, self.rows.read_value())
        for slot in slots.values():
            slot.scatter_update(tf.IndexedSlices(self.state[slot.ref()].read_value(), rows))

    def apply_sgd_repeated(self, gradient: tf.IndexedSlices, learning_rate) -> None:
        """Plain SGD on a gradient with repeated ids: applied one entry after another in their order
        (:meth:`SparseSGD.apply_repeated`, the float32 table's path), on the distinct rows' copies."""
        unique, position = tf.unique(gradient.indices)
        self.rows.assign(gather_float32(self.variable, unique))
        SparseSGD.apply_repeated(self.rows, tf.IndexedSlices(gradient.values, position), learning_rate)
        scatter_float32(self.variable, unique, self.rows.read_value())
