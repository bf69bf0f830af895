"""The fused table variables of a :class:`~tf_dlrm.embedding.DistributedEmbedding` (a mixin).

The model-parallel slices a rank owns are fused by width: all slices of width ``w`` live in one
``[sum of their rows, w]`` variable (a row band: its own rows), each at a row offset, so one gather
serves them all.
Replicated (small) tables are fused the same way into data-parallel variables.

Every variable is filled with its slices' initial values (:mod:`tf_dlrm.embedding.table_init`: they
depend on ``(seed, table)`` only, never on the sharding) and carries its kind and its
:class:`~tf_dlrm.embedding.variable_kind.SliceLayout`. With ``split_embedding_tables`` a model-parallel
variable is a split bf16 table (:mod:`tf_dlrm.embedding.split_tables`).

A mixin because it reads the layer's plan, features, seed and options, and adds weights to it.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_dlrm.embedding.exchange import index_dtype
from tf_dlrm.embedding.split_tables import add_split_weight, scatter_float32
from tf_dlrm.embedding.table_init import initial_table_blocks
from tf_dlrm.embedding.variable_kind import SliceLayout, VariableKind, mark, set_layout


def _in_stateless_scope() -> bool:
    try:
        from keras.src.backend.common.stateless_scope import in_stateless_scope
    except ImportError:  # another Keras layout: take the path that is right in both cases
        return True
    return in_stateless_scope()


class FusedVariables:
    """Makes the fused, initialised and marked variables of the layer it is mixed into."""

    def _row_offsets(self, slices) -> tuple[np.ndarray, int]:
        rows = [self.plan.slice_rows(s) for s in slices]
        dtype = index_dtype(int(sum(rows))).as_numpy_dtype
        offsets = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(dtype) if rows else np.zeros(0, dtype)
        return offsets, int(sum(rows))

    def _layout(self, slices, offsets=()) -> SliceLayout:
        """What the fused variable's rows hold, for optimizers whose state spans a whole row."""
        split = [t for t in self.model_parallel if self.plan.column_split(t)]
        problems = [f"table {self.plan.tables[t].name!r} is cut into row bands and column slices (a grid)"
                    for t in split if t in self.plan.row_sliced]
        for table in split:
            readers = [self.features[f] for f, t in enumerate(self.feature_tables) if t == table]
            if len(readers) != 1 or not readers[0].one_hot:
                # The per-row sums of squares travel as [global batch, split tables] (one entry per
                # sample): exact for one one-hot feature per column-sliced table only.
                problems.append(f"column-sliced table {self.plan.tables[table].name!r} is read by "
                                f"{[(f.name, f.hotness) for f in readers]} (feature, hotness)")
        problem = None
        if problems:
            # Plans from make_plan keep such tables whole (kept_whole); a plan given by hand, or a row-wise
            # optimizer the step was given while the tables name none, may still cut one.
            problem = ("row-wise optimizer state stays exact on a column-sliced table only when one one-hot feature "
                       f"reads it and its rows are not also cut into bands: {'; '.join(problems)}. Keep the table whole (a plan from plan_tables, its TableConfig's "
                       "placement 'auto' or 'table_wise'; in main.py --dist_strategy=table_wise or a higher "
                       "--column_slice_threshold), or use an optimizer with state per element (Adagrad)")
        return SliceLayout([s.table for s in slices], [(s.column_start, s.column_end) for s in slices],
                           [self.plan.tables[s.table].dim for s in slices], split_tables=split,
                           row_offsets=list(offsets) if len(offsets) else None, row_wise_problem=problem)

    def _fused_variable(self, name: str, slices, kind: VariableKind, trainable: bool = True):
        offsets, total_rows = self._row_offsets(slices)
        width = slices[0].width if slices else 0
        split = self.split_embedding_tables and kind is VariableKind.SHARDED
        if split and _in_stateless_scope():
            # Split bf16 halves cut from the float32 values at once (tf_dlrm.embedding.split_tables).
            values = self._initial_values((total_rows, width), slices, offsets)
            return set_layout(mark(add_split_weight(self, name, values), kind), self._layout(slices, offsets)), offsets
        if split:
            # Both halves filled block by block, like a float32 shard: no float32 copy of the shard.
            variable = add_split_weight(self, name, shape=(total_rows, width))
            self._fill_blocks(variable, slices, offsets)
            return set_layout(mark(variable, kind), self._layout(slices, offsets)), offsets
        # Tables stay float32 under mixed precision: bf16/fp16 SGD updates of tiny gradients round
        # away. autocast=False: Keras would otherwise cast the whole table on every read.
        if _in_stateless_scope():
            # Keras builds the layer while tracing a symbolic call: variables are initialised later
            # from their initializer, so it must hold the values (a second copy while it runs).
            def initializer(shape, dtype):
                return tf.constant(self._initial_values(shape, slices, offsets))
            variable = self.add_weight(name=name, shape=(total_rows, width), dtype="float32", trainable=trainable,
                                       initializer=initializer, autocast=False)
        else:
            # Filled block by block (no full copy beside the variable): a shard may take most of a
            # process's memory.
            variable = self.add_weight(name=name, shape=(total_rows, width), dtype="float32", trainable=trainable,
                                       initializer="zeros", autocast=False)
            self._fill_blocks(variable, slices, offsets)
        # The kind and the layout travel on the variable: the trainer and the checkpoint need no
        # attribute names of this layer (tf_dlrm.embedding.variable_kind).
        return set_layout(mark(variable, kind), self._layout(slices, offsets)), offsets

    def _fill_blocks(self, variable, slices, offsets) -> None:
        for piece, offset in zip(slices, offsets):
            for start, block in self._initial_blocks(piece):
                rows = tf.range(int(offset) + start, int(offset) + start + block.shape[0], dtype=tf.int64)
                scatter_float32(variable, rows, tf.constant(block))

    def _initial_blocks(self, piece):
        spec = self.plan.tables[piece.table]
        start, end = self.plan.row_range(piece)
        return initial_table_blocks(self.seed, piece.table, spec.rows, spec.dim, piece.column_start, piece.column_end,
                                    self.table_init_bound(piece.table), start, end)

    def _initial_values(self, shape, slices, offsets) -> np.ndarray:
        values = np.empty(shape, np.float32)
        for piece, offset in zip(slices, offsets):
            for start, block in self._initial_blocks(piece):
                values[int(offset) + start:int(offset) + start + block.shape[0]] = block
        return values
