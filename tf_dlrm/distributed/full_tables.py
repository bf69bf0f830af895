"""Whole tables in and out of a :class:`~tf_dlrm.distributed.embedding.DistributedEmbedding`.

Checkpoints, export and the equivalence tests see a table as one ``[rows, D]`` array, wherever its
slices live: :meth:`FullTableAccess.get_full_table` gathers the slices (or their optimizer state) on
rank 0, :meth:`FullTableAccess.set_full_table` scatters rank 0's array to the owners. Both are
collectives: every rank calls them for the same table in the same order. A mixin because it reads
the layer's plan, fused variables and offsets, and nothing else.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_dlrm.distributed import collectives
from tf_dlrm.distributed.packing import packing_groups
from tf_dlrm.distributed.split_tables import read_float32, write_float32


class FullTableAccess:
    """Gathers and scatters whole tables of the layer it is mixed into (see the module docstring)."""

    def _my_pieces(self, table: int):
        """(variable index, row offset, slice) for every slice of ``table`` on this rank, plan order."""
        pieces = []
        for index, ((width, slices), offsets) in enumerate(zip(self.groups, self.group_offsets)):
            for piece, offset in zip(slices, offsets):
                if piece.table == table:
                    pieces.append((index, int(offset), piece))
        return pieces

    def _table_layout(self, table: int):
        """(rank, slice) of ``table`` in the order ranks send them: rank order, packing order within."""
        layout = []
        for rank in range(self.plan.world_size):
            for _, slices in packing_groups(self.plan, rank):
                layout.extend((rank, s) for s in slices if s.table == table)
        return layout

    def get_full_table(self, table: int, state_of=None, row_wise: bool = False) -> np.ndarray | None:
        """Collective: the full ``[rows, D]`` table on rank 0 (None elsewhere); one table at a time.

        With ``state_of`` (a function from an embedding variable to its optimizer state variable,
        shaped like it) the same gather returns that state in full-table layout instead: ``[rows, D]``,
        or ``[rows, 1]`` for ``row_wise`` state, of which every slice of a row holds a copy.
        """
        rows = self.cardinalities[table]
        dim = 1 if row_wise else self.plan.tables[table].dim
        state_of = state_of or (lambda variable: variable)
        if table in self.replicated:
            index, offset = self._replicated_place(table)
            return read_float32(state_of(self.replicated_variables[index]), offset, offset + rows).numpy() if self.env.is_chief else None
        # Split bf16 tables are read as their float32 values (both halves joined): checkpoints hold float32.
        mine = [tf.reshape(read_float32(state_of(self.shard_variables[i]), o, o + rows), [-1]) for i, o, _ in self._my_pieces(table)]
        if self.env.distributed:
            # Everything goes to rank 0: an alltoall whose splits send all to rank 0 gathers to
            # the root. A rank holding none of this table sends one padding value (Horovod's
            # alltoall hangs on an empty send), which the root skips.
            flat = tf.concat(mine, axis=0) if mine else tf.zeros([1], tf.float32)
            splits = [int(flat.shape[0])] + [0] * (self.plan.world_size - 1)
            flat = collectives.alltoall(self.env, flat, splits, name=f"{self.name}_gather_table_{table}")
        else:
            flat = tf.concat(mine, axis=0)
        if not self.env.is_chief:
            return None
        full = np.empty((rows, dim), np.float32)
        position, values = 0, flat.numpy()
        layout = self._table_layout(table)
        for rank in range(self.plan.world_size):
            pieces = [piece for owner, piece in layout if owner == rank]
            if not pieces and self.env.distributed:
                position += 1
            for piece in pieces:
                start, end = (0, 1) if row_wise else (piece.column_start, piece.column_end)
                size = rows * (end - start)
                full[:, start:end] = values[position:position + size].reshape(rows, end - start)
                position += size
        # Hot rows: the replicas hold the model's values, the owner's copies are stale.
        self._overlay_hot_rows(table, full, state_of)
        return full

    def set_full_table(self, table: int, values: np.ndarray | None, state_of=None, row_wise: bool = False) -> None:
        """Collective: rank 0 passes the full table (others None); each rank keeps what it owns.
        ``state_of`` and ``row_wise``: as in :meth:`get_full_table` (every slice of a row gets the
        row's row-wise state)."""
        rows = self.cardinalities[table]
        dim = 1 if row_wise else self.plan.tables[table].dim
        state_of = state_of or (lambda variable: variable)
        if table in self.replicated:
            index, offset = self._replicated_place(table)
            full = values if self.env.is_chief else np.zeros((rows, dim), np.float32)
            full = collectives.broadcast(self.env, tf.constant(full, tf.float32), name=f"{self.name}_set_table_{table}")
            self._assign_rows(state_of(self.replicated_variables[index]), offset, full)
            return
        if self.env.is_chief:
            values = np.asarray(values, np.float32)
            if values.shape != (rows, dim):
                raise ValueError(f"table {table} ({self.plan.tables[table].name!r}): expected shape {(rows, dim)}. "
                                 f"Received: {values.shape}")
            per_rank = [[] for _ in range(self.plan.world_size)]
            for rank, piece in self._table_layout(table):
                start, end = (0, 1) if row_wise else (piece.column_start, piece.column_end)
                per_rank[rank].append(values[:, start:end].reshape(-1))
            # One padding value to ranks holding none of the table: Horovod hangs on empty sends.
            sends = [np.concatenate(p) if p else np.zeros(1, np.float32) for p in per_rank]
            flat, splits = np.concatenate(sends), [s.shape[0] for s in sends]
        else:
            flat, splits = np.zeros(1, np.float32), [1] + [0] * (self.plan.world_size - 1)
        if self.env.distributed:
            received = collectives.alltoall(self.env, tf.constant(flat), splits, name=f"{self.name}_scatter_table_{table}").numpy()
        else:
            received = flat
        position = 0
        for index, offset, piece in self._my_pieces(table):
            piece_width = 1 if row_wise else piece.width
            size = rows * piece_width
            variable = state_of(self.shard_variables[index])
            self._assign_rows(variable, offset, received[position:position + size].reshape(rows, piece_width))
            position += size
        self._set_hot_rows(table, values, state_of, dim)

    def _replicated_place(self, table: int) -> tuple[int, int]:
        """(replicated variable index, row offset) of a replicated table."""
        for index, ((_, slices), offsets) in enumerate(zip(self.replicated_groups, self.replicated_offsets)):
            for piece, offset in zip(slices, offsets):
                if piece.table == table:
                    return index, int(offset)
        raise ValueError(f"table {table} is not replicated")

    @staticmethod
    def _assign_rows(variable, offset: int, values) -> None:
        write_float32(variable, offset, values)  # split again for a split bf16 table
