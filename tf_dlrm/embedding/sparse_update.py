"""Applies the embedding optimizer to this rank's embedding variables, touched rows only.

- ``sharded`` variables (this rank's fused shards): the exchange's backward delivers ``N`` times the
  gradient of the global mean loss as ``IndexedSlices``, one entry per looked-up id; it is scaled by
  ``1/N``, repeated ids are summed (:func:`deduplicate`), and the optimizer updates those rows.
  A variable read through tf_dlrm's embedding-bag kernel gets its gradient summed per distinct
  row already (:mod:`tf_dlrm.ops.embedding_bag`): it skips that deduplication, and plain
  SGD updates its rows with one multi-threaded op.
- ``replicated`` tables: their gradient joins the dense allreduce (averaged over ranks). With a
  stateful optimizer it carries one extra column counting each row's lookups, so after the
  allreduce every rank knows the rows touched anywhere in the global batch, which are exactly the
  rows one process would update (lazy Adam must not touch the others, even with a zero gradient).
- Row-wise optimizers on column-sliced tables: see :meth:`SparseUpdater.row_mean_squares`.
- Split bfloat16 shards (``--split_embedding_tables``): their bf16 gradient is taken to float32
  before anything else, and each optimizer runs on the touched rows joined back into float32
  (:mod:`tf_dlrm.embedding.split_update`): the same update as a float32 table's.

State variables are made here, one set per embedding variable and shaped like it
(:meth:`SparseOptimizer.create_slots`), so whatever moves a shard can move its state.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_dlrm.parallel import collectives
from tf_dlrm.ops.embedding_bag import apply_sgd_to_distinct_rows, distinct_rows
from tf_dlrm.parallel.env import DistributedEnv
from tf_dlrm.embedding.split_tables import gather_float32, is_split
from tf_dlrm.embedding.variable_kind import layout_of
from tf_dlrm.optimizers.sparse_optimizer import SparseOptimizer, deduplicate, scatter_sub
from tf_dlrm.optimizers.sparse_sgd import SparseSGD
from tf_dlrm.embedding.row_frequency import COUNT_SLOT, RowCounts
from tf_dlrm.embedding.split_update import SplitTableUpdate, float32_gradient
from tf_dlrm.embedding.table_optimizers import TableOptimizers


class SparseUpdater:
    """The embedding optimizer of one rank: state, replicated-gradient packing and the update.

    Args:
        optimizer: the sparse optimizer.
        env: this rank's place.
        shards: this rank's ``sharded`` variables (marked with a :class:`SliceLayout`).
        replicated: its ``replicated`` variables.
        padding: its ``padding`` variables (they carry the plan's split tables on a rank owning no slice).
        weight_decay: L2 coefficient added to the gradient of each touched row (``g + wd * w``), or of every
            row for an optimizer that updates every row (``dense_adam``: Keras's Adam under an L2 loss).
        table_optimizers: ``{table index: (optimizer, rate scale)}`` for tables trained by another
            sparse optimizer at ``rate scale`` times the embedding rate (Wide & Deep's wide part);
            the same on every rank (:mod:`tf_dlrm.embedding.table_optimizers`).
        hot: its ``hot`` variables (hot-row replicas of whole rows; their gradients arrive summed
            over ranks as ``(rows, values)``, the same on every rank).
        frequency_regularizer: None, or the model's
            :class:`tf_dlrm.embedding.table_config.FrequencyRegularizer`: each row of the tables
            (not of dynamic ones) counts its steps, and the regularizer applies to the touched rows
            (:mod:`tf_dlrm.embedding.row_frequency`).
    """

    def __init__(self, optimizer: SparseOptimizer, env: DistributedEnv, shards, replicated, padding=(), weight_decay: float = 0.0,
                 table_optimizers=None, hot=(), frequency_regularizer=None):
        self.optimizer, self.env = optimizer, env
        self.shards, self.replicated, self.hot = list(shards), list(replicated), list(hot)
        self.weight_decay = float(weight_decay)
        self.groups = TableOptimizers(optimizer, table_optimizers)
        # Dynamic tables' storage (sharded, without a slice layout) admits keys by its own min_count.
        counted = [v for v in self.shards if layout_of(v) is not None] + self.replicated + self.hot
        self.row_counts = RowCounts(frequency_regularizer, counted) if frequency_regularizer is not None else None
        # Per variable: {group: its optimizer's state} for every group whose tables it holds.
        self.shard_groups = [self.groups.slice_groups(v) for v in self.shards]
        self.replicated_groups = [self.groups.slice_groups(v) for v in self.replicated]
        self.shard_slots = [self._create_slots(v, g) for v, g in zip(self.shards, self.shard_groups)]
        self.replicated_slots = [self._create_slots(v, g) for v, g in zip(self.replicated, self.replicated_groups)]
        self.hot_groups = [self.groups.slice_groups(v) for v in self.hot]
        self.hot_slots = [self._create_slots(v, g) for v, g in zip(self.hot, self.hot_groups)]
        # Split bf16 shards: scratch rows and state for their float32 update, by variable.
        self.split_updates = {
            id(v): SplitTableUpdate(v, [slot for state in slots.values() for slot in state.values()])
            for v, slots in zip(self.shards, self.shard_slots) if is_split(v)}
        if any(is_split(v) for v in self.replicated + self.hot):
            raise ValueError("Only model-parallel (sharded) embedding variables may be split bfloat16 tables")
        # SGD without decay is linear in the gradient: repeated ids need not be summed first.
        self.plain_sgd = (isinstance(optimizer, SparseSGD) and not self.weight_decay and not self.groups.overridden
                          and self.row_counts is None)
        layouts = [layout_of(v) for v in self.shards + list(padding)]
        problems = {layout.row_wise_problem for layout in layouts if layout is not None and layout.row_wise_problem}
        if optimizer.row_wise and problems:
            raise ValueError(f"Row-wise optimizer {optimizer.name}: {problems.pop()}")
        self.split_tables = next((layout.split_tables for layout in layouts if layout is not None), ())
        self._column_of_table = {t: i for i, t in enumerate(self.split_tables)}
        # The variables whose weight decay their optimizer applies itself, to every row (dense_adam).
        self._decayed_whole = set()
        if self.weight_decay:
            for variable, slots in zip(self.shards + self.replicated + self.hot, self.shard_slots + self.replicated_slots + self.hot_slots):
                chosen = [self.groups.choices[g][0] for g in slots]
                if len(chosen) > 1 and any(o.decays_every_row for o in chosen):
                    name = next(o.name for o in chosen if o.decays_every_row)
                    raise ValueError(
                        f"Expected the tables of {name} alone in their embedding variable under --embedding_weight_decay "
                        f"({name} decays every row of its variable). Received: a variable holding tables of "
                        f"{sorted(o.name for o in chosen)}; give them one optimizer, or widths of their own")
                # A split table's update runs on the touched rows' scratch copy, where every optimizer is lazy:
                # it is decayed on those rows.
                if chosen[0].decays_every_row and id(variable) not in self.split_updates:
                    self._decayed_whole.add(id(variable))

    def _create_slots(self, variable, groups) -> dict:
        return {int(g): self.groups.choices[g][0].create_slots(variable) for g in sorted(set(groups.tolist()))}

    # ------------------------------------------------------------------ state

    @property
    def slot_names(self) -> tuple[str, ...]:
        return tuple(self.optimizer.slots)

    def table_optimizer(self, table: int) -> SparseOptimizer:
        """The sparse optimizer of table ``table`` (the same answer on every rank)."""
        return self.groups.table_optimizer(table)

    def state_entries(self, num_tables: int) -> list[tuple[str, int]]:
        """``(slot, table)`` of every piece of state, in the same order on every rank (the rows'
        counts last, slot ``row_count``, when a frequency regularizer keeps them)."""
        counts = [(COUNT_SLOT, t) for t in range(num_tables)] if self.row_counts is not None else []
        return self.groups.state_entries(num_tables) + counts

    def state_row_wise(self, slot: str, table: int) -> bool:
        """Whether state ``slot`` of ``table`` is one value per row (a copy in every column slice)."""
        return slot == COUNT_SLOT or self.table_optimizer(table).row_wise

    @property
    def row_wise(self) -> bool:
        return self.optimizer.row_wise

    def slot(self, variable, name: str, table: int | None = None):
        """The state variable ``name`` of the embedding variable ``variable`` (of the optimizer of
        ``table`` when given, else of the embedding optimizer)."""
        if name == COUNT_SLOT and self.row_counts is not None:
            counts = self.row_counts.count_of(variable)
            if counts is not None:
                return counts
        group = self.groups.group_of_table(table) if table is not None else 0
        for variables, slots in ((self.shards, self.shard_slots), (self.replicated, self.replicated_slots),
                                 (self.hot, self.hot_slots)):
            for candidate, state in zip(variables, slots):
                if candidate is variable:
                    return state[group if group in state else min(state)][name]
        raise KeyError(f"{getattr(variable, 'path', variable)} is not an embedding variable of this trainer")

    @property
    def variables(self) -> list:
        counts = self.row_counts.variables if self.row_counts is not None else []
        return [slots[name] for state in self.shard_slots + self.replicated_slots + self.hot_slots
                for slots in state.values() for name in slots] + counts

    # ------------------------------------------------------------------ replicated tables

    def pack_replicated(self, gradient, variable) -> tf.Tensor:
        """The dense gradient of a replicated table for the allreduce; with a stateful optimizer,
        plus a last column counting each row's lookups (> 0: touched in the global batch)."""
        rows = variable.shape[0]
        if not isinstance(gradient, tf.IndexedSlices):  # a dense gradient touches every row
            gradient = tf.IndexedSlices(gradient, tf.range(rows), None)
        values = gradient.values
        if not self.plain_sgd:
            values = tf.concat([values, tf.ones([tf.shape(values)[0], 1], values.dtype)], axis=1)
        return tf.math.unsorted_segment_sum(values, gradient.indices, rows)

    # ------------------------------------------------------------------ the update

    def apply(self, shard_gradients, replicated_gradients, learning_rate, step, global_batch, hot_gradients=()) -> None:
        """Updates every embedding variable of this rank (collective for row-wise optimizers on
        column-sliced tables: every rank calls it each step)."""
        scale = 1.0 / self.env.world_size
        if self.plain_sgd:
            for variable, (rows, summed) in zip(self.hot, hot_gradients):
                scatter_sub(variable, rows, summed * (learning_rate * scale))  # distinct rows: deduplicated
            for variable, gradient in zip(self.shards, shard_gradients):
                if id(variable) in self.split_updates:
                    self.split_updates[id(variable)].apply_sgd_repeated(float32_gradient(gradient), learning_rate * scale)
                elif distinct_rows(variable):  # one row per thread, no lock held between rows
                    apply_sgd_to_distinct_rows(variable, gradient, learning_rate * scale)
                else:
                    SparseSGD.apply_repeated(variable, gradient, learning_rate * scale)
            for variable, gradient in zip(self.replicated, replicated_gradients):
                variable.assign_sub(gradient * learning_rate)
            return
        updates = []  # (variable, slots, layout, rows, summed gradient, position of each entry)
        for variable, slots, gradient in zip(self.shards, self.shard_slots, shard_gradients):
            # A split table's, and a float32 table's rows read in bfloat16 (exchange.gather_rows): summed in float32.
            gradient = float32_gradient(gradient)
            if distinct_rows(variable):
                # Summed per distinct row by the embedding-bag kernel's gradient already. No
                # position: such a variable holds no slice of a column-sliced table (the layer checks),
                # the only place row_mean_squares reads positions.
                rows, summed, position = gradient.indices, gradient.values, None
            else:
                rows, summed, position = deduplicate(gradient)
            summed = summed * scale if self.env.world_size > 1 else summed  # one pass fewer in one process
            updates.append((variable, slots, layout_of(variable), rows, summed, position))
        groups = self.shard_groups + self.replicated_groups + self.hot_groups
        for variable, slots, packed in zip(self.replicated, self.replicated_slots, replicated_gradients):
            rows = tf.reshape(tf.where(packed[:, -1] > 0), [-1])
            updates.append((variable, slots, None, rows, tf.gather(packed[:, :-1], rows), None))
        for variable, slots, (rows, summed) in zip(self.hot, self.hot_slots, hot_gradients):
            # Whole rows (no layout): row-wise state needs no exchange.
            updates.append((variable, slots, None, rows, summed * scale if self.env.world_size > 1 else summed, None))
        if self.row_counts is not None:
            updates = [(v, s, lay, rows, self.row_counts.regularize(v, rows, g, global_batch), p) for v, s, lay, rows, g, p in updates]
        if self.weight_decay:
            updates = [(v, s, lay, rows, g if id(v) in self._decayed_whole else g + self.weight_decay * gather_float32(v, rows), p)
                       for v, s, lay, rows, g, p in updates]
        means = self.row_mean_squares(updates, global_batch) if self.row_wise else [None] * len(updates)
        for (variable, slots, layout, rows, gradient, _), mean, slice_groups in zip(updates, means, groups):
            if len(slots) == 1:  # every table of the variable has one optimizer
                group = next(iter(slots))
                optimizer, rate_scale = self.groups.choices[group]
                rate = learning_rate if rate_scale == 1.0 else learning_rate * rate_scale
                decay = self.weight_decay if id(variable) in self._decayed_whole else 0.0
                self._apply(optimizer, variable, slots[group], rows, gradient, rate, step, mean, decay)
                continue
            # Rows of tables trained by different optimizers: each optimizer updates its own rows.
            row_groups = tf.gather(tf.constant(slice_groups), self._slice_of_rows(layout_of(variable), rows))
            for group, state in slots.items():
                optimizer, rate_scale = self.groups.choices[group]
                mine = tf.equal(row_groups, group)
                part_mean = tf.boolean_mask(mean, mine) if mean is not None else None
                self._apply(optimizer, variable, state, tf.boolean_mask(rows, mine), tf.boolean_mask(gradient, mine),
                            learning_rate * rate_scale, step, part_mean)

    def _apply(self, optimizer, variable, slots, rows, gradient, rate, step, mean, decay: float = 0.0) -> None:
        split = self.split_updates.get(id(variable))
        if decay:
            optimizer.apply(variable, slots, rows, gradient, rate, step, row_mean_squares=mean, weight_decay=decay)
        elif split is None:
            optimizer.apply(variable, slots, rows, gradient, rate, step, row_mean_squares=mean)
        else:
            split.apply(optimizer, slots, rows, gradient, rate, step, row_mean_squares=mean)

    def row_mean_squares(self, updates, global_batch) -> list[tf.Tensor]:
        """Each touched row's mean squared gradient over its whole width, for row-wise state.

        A table whose columns are cut over several slices (on this rank or others) holds each
        slice's partial sum of squares only. **One small allreduce per step** makes them exact:
        every rank looks up the same global batch of ids for a table it holds a slice of, in the
        same order, so the partial sums are laid out as ``[global_batch, split tables]`` (entry
        ``b`` of table ``t`` = the sum over this rank's columns of ``t`` of the squared summed
        gradient of the row that sample ``b`` looks up); the sum of that matrix over ranks holds
        the whole-row sums, read back by every slice of the row. A rank holding nothing of a split
        table adds zeros. Whole tables need no exchange.
        """
        means = []
        split = len(self.split_tables)
        contributions, pending = tf.zeros([global_batch, split], tf.float32), []
        for variable, _, layout, rows, gradient, position in updates:
            partial = tf.reduce_sum(tf.square(gradient), axis=1)  # [U]
            if layout is None:  # a replicated variable stacks whole tables of its width
                dims = float(variable.shape[1])
            elif len(set(layout.dims)) == 1:  # one width for every table of the variable: no lookup
                dims = float(layout.dims[0])
            else:
                dims = tf.gather(tf.constant(layout.dims, tf.float32), self._slice_of_rows(layout, rows))
            assignment = self._split_assignment(layout) if layout is not None else None
            if assignment is None or not assignment.any():
                means.append(partial / dims)
                pending.append(None)
                continue
            per_entry = tf.reshape(tf.gather(partial, position), [-1, len(layout.tables)])  # [B, S]
            contributions += tf.matmul(per_entry, tf.constant(assignment))
            pending.append((per_entry, assignment, position, tf.shape(rows)[0], dims))
            means.append(None)
        if not split:
            return means
        totals = collectives.sum_over_ranks(self.env, contributions, name="rowwise_square_sums")
        for index, entry in enumerate(pending):
            if entry is None:
                continue
            per_entry, assignment, position, count, dims = entry
            whole = assignment.any(axis=1).astype(np.float32)  # 1 for slices of split tables
            rows_total = tf.matmul(totals, tf.constant(assignment.T)) + per_entry * (1.0 - whole)
            # Every entry of a row holds the same total: take any one of them per unique row.
            means[index] = tf.math.unsorted_segment_max(tf.reshape(rows_total, [-1]), position, count) / dims
        return means

    def _split_assignment(self, layout) -> np.ndarray:
        """``[slices, split tables]``: 1 where a slice belongs to a column-sliced table."""
        matrix = np.zeros((len(layout.tables), len(self.split_tables)), np.float32)
        for index, table in enumerate(layout.tables):
            if table in self._column_of_table:
                matrix[index, self._column_of_table[table]] = 1.0
        return matrix

    @staticmethod
    def _slice_of_rows(layout, rows) -> tf.Tensor:
        """The slice (0..S-1) of each fused row, from the slices' first rows (any lookup order)."""
        offsets = tf.constant(layout.row_offsets, rows.dtype)
        return tf.searchsorted(offsets, rows, side="right") - 1
