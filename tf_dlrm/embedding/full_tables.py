"""Whole tables in and out of a :class:`~tf_dlrm.embedding.DistributedEmbedding`.

Two ways in and out:

- Whole tables, through rank 0: :meth:`FullTableAccess.get_full_table` gathers the slices (or their
  optimizer state) of one ``[rows, D]`` table on rank 0, :meth:`FullTableAccess.set_full_table`
  scatters rank 0's array to the owners. Both are collectives: every rank calls them for the same
  table in the same order. The equivalence tests use them; no table may then exceed rank 0's memory.
- Pieces, on their owners: :meth:`FullTableAccess.table_pieces` names what this rank holds of a table,
  :meth:`read_piece_rows` and :meth:`assign_piece_rows` move row ranges of one piece between the
  variable and numpy, and :meth:`set_hot_rows_from` fills the hot-row replicas from a reader. No
  collective and no full table: sharded checkpoints (:mod:`tf_dlrm.checkpoint.slices`) write
  and read every slice on the rank that owns it, chunk by chunk.

A mixin because it reads the layer's plan, fused variables and offsets, and nothing else.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from tf_dlrm.parallel import collectives
from tf_dlrm.sharding.packing import packing_groups
from tf_dlrm.embedding.split_tables import gather_float32, read_float32, write_float32


@dataclasses.dataclass(frozen=True)
class TablePiece:
    """Columns ``[column_start, column_end)`` of rows ``[row_start, row_end)`` of one table as this rank holds them.

    ``replicated``: the table is whole on every rank (``variable`` indexes the replicated
    variables), else ``variable`` indexes the shard variables; the piece's first row (``row_start``)
    is row ``offset`` of that fused variable.
    """
    table: int
    column_start: int
    column_end: int
    variable: int
    offset: int
    replicated: bool = False
    row_start: int = 0
    row_end: int = 0

    @property
    def width(self) -> int:
        return self.column_end - self.column_start

    @property
    def rows(self) -> int:
        return self.row_end - self.row_start


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

    def table_index(self, table) -> int:
        """The index of ``table`` (an index, or a table's name)."""
        if isinstance(table, str):
            names = [t.name for t in self.plan.tables]
            if table not in names:
                raise ValueError(f"Expected one of the tables {names}. Received: {table!r}")
            return names.index(table)
        return int(table)

    def get_full_table(self, table, state_of=None, row_wise: bool = False) -> np.ndarray | None:
        """Collective: the full ``[rows, D]`` table (index or name) on rank 0 (None elsewhere); one
        table at a time.

        With ``state_of`` (a function from an embedding variable to its optimizer state variable,
        shaped like it) the same gather returns that state in full-table layout instead: ``[rows, D]``,
        or ``[rows, 1]`` for ``row_wise`` state, of which every slice of a row holds a copy.
        """
        table = self.table_index(table)
        rows = self.cardinalities[table]
        dim = 1 if row_wise else self.plan.tables[table].dim
        state_of = state_of or (lambda variable: variable)
        if table in self.replicated:
            index, offset = self._replicated_place(table)
            return read_float32(state_of(self.replicated_variables[index]), offset, offset + rows).numpy() if self.env.is_chief else None
        # Split bf16 tables are read as their float32 values (both halves joined): checkpoints hold float32.
        mine = [tf.reshape(read_float32(state_of(self.shard_variables[i]), o, o + self.plan.slice_rows(p)), [-1])
                for i, o, p in self._my_pieces(table)]
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
                first, last = self.plan.row_range(piece)
                size = (last - first) * (end - start)
                full[first:last, start:end] = values[position:position + size].reshape(last - first, end - start)
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
                first, last = self.plan.row_range(piece)
                per_rank[rank].append(values[first:last, start:end].reshape(-1))
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
            piece_width, piece_rows = 1 if row_wise else piece.width, self.plan.slice_rows(piece)
            size = piece_rows * piece_width
            variable = state_of(self.shard_variables[index])
            self._assign_rows(variable, offset, received[position:position + size].reshape(piece_rows, piece_width))
            position += size
        self._set_hot_rows(table, values, state_of, dim)

    # ------------------------------------------------------------------ pieces on their owners

    def table_pieces(self, table: int) -> list[TablePiece]:
        """What this rank holds of ``table``: its slices (column slices, row bands), or the whole replicated table."""
        if table in self.replicated:
            index, offset = self._replicated_place(table)
            return [TablePiece(table, 0, self.plan.tables[table].dim, index, offset, replicated=True, row_start=0,
                               row_end=self.cardinalities[table])]
        return [TablePiece(table, s.column_start, s.column_end, index, offset, False, *self.plan.row_range(s))
                for index, offset, s in self._my_pieces(table)]

    def _piece_variable(self, piece: TablePiece, state_of=None):
        variable = (self.replicated_variables if piece.replicated else self.shard_variables)[piece.variable]
        return (state_of or (lambda v: v))(variable)  # the marked variable: a split table reads float32

    def read_piece_rows(self, piece: TablePiece, start: int, stop: int, state_of=None, row_wise: bool = False) -> np.ndarray:
        """Table rows ``[start, stop)`` (inside the piece's ``[row_start, row_end)``) of ``piece`` (``[n, width]``, or
        ``[n, 1]`` row-wise state), the hot-row replicas written over the owner's stale copies. Reads those rows only."""
        first = piece.offset - piece.row_start
        rows = tf.range(first + start, first + stop, dtype=tf.int64)
        values = gather_float32(self._piece_variable(piece, state_of), rows).numpy()
        if not piece.replicated and piece.table in getattr(self, "hot_index", {}):
            ids = np.asarray(self.hot_rows[piece.table], np.int64)
            inside = (ids >= start) & (ids < stop)
            if inside.any():
                replica = (state_of or (lambda v: v))(self.hot_variables[self.hot_index[piece.table]])
                replica = replica if isinstance(replica, tf.Variable) else replica.value
                hot = tf.gather(replica, np.flatnonzero(inside)).numpy()
                values[ids[inside] - start] = hot if row_wise else hot[:, piece.column_start:piece.column_end]
        return values

    def assign_piece_rows(self, piece: TablePiece, start: int, values, state_of=None) -> None:
        """Writes ``values`` (``[n, width]`` or row-wise ``[n, 1]``) into table rows ``[start, start + n)`` of ``piece``."""
        self._assign_rows(self._piece_variable(piece, state_of), piece.offset - piece.row_start + start, values)

    def set_hot_rows_from(self, table: int, read_rows, state_of=None) -> None:
        """Fills this rank's replica of ``table``'s hot rows (or their state) with ``read_rows(ids)``
        (``[len(ids), D]``); no collective: every rank reads the rows itself."""
        if table not in getattr(self, "hot_index", {}):
            return
        target = (state_of or (lambda v: v))(self.hot_variables[self.hot_index[table]])
        (target if isinstance(target, tf.Variable) else target.value).assign(
            np.asarray(read_rows(np.asarray(self.hot_rows[table], np.int64)), np.float32))

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
