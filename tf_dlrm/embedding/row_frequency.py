"""Regularization of embedding rows by how often training has seen them (rare ids).

On click logs most ids are seen once or twice (KDD 2012's 40k-row sample has 19k ads, 31k queries, 30k
users). An adaptive optimizer moves a row seen once by a full step whatever its gradient's size, so its
vector ends up encoding the one label it saw: the model memorizes the tail. Frequency state fixes that
where it starts:

- **count**: each row keeps the number of training steps whose global batch looked it up
  (``[rows, 1]`` float32 beside its shard, exact up to ``2^24`` steps);
- **admission** (``min_count``): a row is not updated until the step that brings its count to
  ``min_count``; before that its gradient is dropped and it keeps its initial values, as a dynamic
  table's key gets no row before ``min_count`` sightings (:class:`tf_dlrm.embedding.DynamicStorage`);
- **frequency-aware L2** (``l2``): each touched row's gradient gets ``l2 * w / (count * B)`` added
  (``B`` the global batch), the penalty of the mini-batch aware regularization of Zhou et al., "Deep
  Interest Network for Click-Through Rate Prediction" (KDD 2018, eq. 4: ``lambda / n_j`` on the rows in
  the batch), with the running count as ``n_j``: rare rows are pulled towards zero, frequent ones
  barely. The loss is a mean over the batch, so a row seen in one sample gets a data gradient of order
  ``1 / B``: dividing by ``B`` keeps the balance of the two, hence the meaning of ``l2``, at any batch size.

The count is a function of the global batch's distinct ids, which every owner of a slice of the row
sees whatever the number of ranks (model-parallel shards look up the global batch; replicated tables
and hot rows update the rows touched anywhere in it): N ranks keep the counts one process keeps.
Every column slice of a row holds its own copy, kept equal, so checkpoints save it like row-wise
optimizer state (slot ``row_count``) and restore it into any plan. One exception: with hot-row replicas
merged every ``S > 1`` steps (``--hot_row_sync_every``), each rank counts its replicas' rows from its own
lookups only (the merge adds optimizer state, not counts); hot rows are the most frequent rows, past
``min_count`` at once and with a negligible ``l2 / count``, so that drift changes next to nothing.
"""

from __future__ import annotations

import tensorflow as tf

from tf_dlrm.embedding.split_tables import gather_float32
from tf_dlrm.optimizers.sparse_optimizer import tf_variable

COUNT_SLOT = "row_count"


class RowCounts:
    """The count state of a rank's embedding variables and the regularization it drives.

    Args:
        regularizer: a :class:`tf_dlrm.embedding.table_config.FrequencyRegularizer` (one per model).
        variables: the embedding variables whose rows are counted (shards, replicated, hot).
    """

    def __init__(self, regularizer, variables):
        self.regularizer = regularizer
        self.counts = {}
        for variable in variables:
            base = variable.path.replace("/", "_") if hasattr(variable, "path") else variable.name
            self.counts[id(variable)] = tf.Variable(tf.zeros([variable.shape[0], 1], tf.float32), trainable=False,
                                                    name=f"{base}_{COUNT_SLOT}")

    def count_of(self, variable):
        """The count variable ``[rows, 1]`` of ``variable``, or None (not counted)."""
        return self.counts.get(id(variable))

    @property
    def variables(self) -> list:
        return list(self.counts.values())

    def regularize(self, variable, rows: tf.Tensor, gradient: tf.Tensor, global_batch) -> tf.Tensor:
        """Counts this step's touched ``rows`` [U] of ``variable`` and returns their gradient [U, width]
        with the admission and the frequency-aware L2 (``global_batch``: ``B``) applied."""
        counts = self.counts.get(id(variable))
        if counts is None:
            return gradient
        seen = tf.gather(counts, rows) + 1.0  # [U, 1], this step included
        tf_variable(counts).scatter_nd_update(tf.expand_dims(rows, 1), seen)
        if self.regularizer.l2:
            per_sample = self.regularizer.l2 / tf.cast(global_batch, tf.float32)
            gradient = gradient + (per_sample / seen) * gather_float32(variable, rows)
        if self.regularizer.min_count > 1:
            gradient = gradient * tf.cast(seen >= float(self.regularizer.min_count), gradient.dtype)
        return gradient
