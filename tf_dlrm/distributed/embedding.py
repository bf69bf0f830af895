"""DistributedEmbedding: executes a ShardingPlan; holds only this rank's shards.

Storage. The model-parallel slices this rank owns are fused by width: all slices of width ``w``
live in one ``[sum of their rows, w]`` variable, each at a row offset, so one gather serves them
all. Replicated (small) tables are fused the same way into one data-parallel variable.

Forward on rank r of N (global batch B, local batch b = B / N):

1. each owned slice looks up the global batch of ids -> packed side by side ``[B, W_r]``
   (the packing order is :func:`packing_groups`: by width, then plan order);
2. one ``hvd.alltoall`` sends row block k (``b`` rows) to rank k; rank r receives ``[b, W_s]``
   from every source s, puts them side by side and permutes the columns once into
   ``[b, T_mp, D]`` in table order;
3. replicated tables look up the local batch directly; the two parts are merged in
   feature-spec order -> ``[b, T, D]``.

With ``data_parallel_input`` every rank reads its local batch of every feature and one
``hvd.alltoall`` of ids gives each rank the global batch of the tables it owns.

The backward of the alltoall (registered by Horovod) returns to each shard the sum over ranks of
its gradient, i.e. N times the gradient of the global mean loss: the trainer scales shard
gradients by 1/N.
"""

from __future__ import annotations

from typing import Mapping

import keras
import numpy as np
import tensorflow as tf

from tf_dlrm.distributed import collectives
from tf_dlrm.distributed.env import DistributedEnv
from tf_dlrm.distributed.exchange import (
    packing_groups,
    received_permutation,
    gather_rows,
    index_dtype,
    permute,
    bfloat16_alltoall,
)
from tf_dlrm.distributed.plan import ShardingPlan
from tf_dlrm.model.table_init import initial_table_slice
from tf_dlrm.model.variable_kind import SliceLayout, VariableKind, mark, set_layout


@keras.saving.register_keras_serializable(package="tf_dlrm")
class DistributedEmbedding(keras.layers.Layer):
    """The embedding tables of DLRM, sharded table-wise and column-wise over ranks.

    Args:
        plan: a :class:`ShardingPlan` (or its ``to_dict()``); all tables must share one dim.
        rank: this process's rank (``plan.world_size`` ranks in all).
        seed: initial values depend only on ``(seed, table)``.
        data_parallel_input: read local batches of every feature and exchange ids (see module doc).
    """

    def __init__(self, plan, rank: int = 0, seed: int = 0, data_parallel_input: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.plan = plan if isinstance(plan, ShardingPlan) else ShardingPlan.from_dict(plan)
        dims = {t.dim for t in self.plan.tables}
        if len(dims) != 1:
            raise ValueError(f"DLRM needs one embedding dim for all tables. Received dims: {sorted(dims)}")
        self.embedding_dim = dims.pop()
        self.env = DistributedEnv(rank=rank, world_size=self.plan.world_size)
        self.seed = int(seed)
        self.data_parallel_input = bool(data_parallel_input)
        self.num_tables = len(self.plan.tables)
        self.cardinalities = tuple(t.rows for t in self.plan.tables)
        self.model_parallel = tuple(self.plan.model_parallel)
        self.replicated = tuple(self.plan.replicated)
        self.owned_tables = tuple(self.plan.tables_on_rank(rank))
        if self.data_parallel_input:
            self.global_categorical, self.local_categorical = (), tuple(range(self.num_tables))
        else:
            self.global_categorical, self.local_categorical = self.owned_tables, self.replicated
        self.groups = packing_groups(self.plan, rank)
        self.permutation = received_permutation(self.plan)
        self.send_widths = [max(1, self.plan.rank_width(r)) for r in range(self.plan.world_size)]
        order = list(self.model_parallel) + list(self.replicated)
        self.feature_order = np.array([order.index(t) for t in range(self.num_tables)], dtype=np.int32)
        self.shard_variables, self.replicated_variable = [], None

    # ------------------------------------------------------------------ weights

    def _row_offsets(self, tables) -> tuple[np.ndarray, int]:
        rows = [self.cardinalities[t] for t in tables]
        dtype = index_dtype(int(sum(rows))).as_numpy_dtype
        offsets = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(dtype) if rows else np.zeros(0, dtype)
        return offsets, int(sum(rows))

    def _layout(self, slices) -> SliceLayout:
        split = [t for t in self.model_parallel if len(self.plan.table_slices(t)) > 1]
        return SliceLayout([s.table for s in slices], [(s.column_start, s.column_end) for s in slices],
                           [self.embedding_dim] * len(slices), split_tables=split)

    def build(self, input_shape=None):
        self.group_offsets = []
        for width, slices in self.groups:
            offsets, total_rows = self._row_offsets([s.table for s in slices])
            values = np.concatenate(
                [initial_table_slice(self.seed, s.table, self.cardinalities[s.table], self.embedding_dim, s.column_start, s.column_end) for s in slices]
            )
            # Tables stay float32 under mixed precision: bf16/fp16 SGD updates of tiny gradients round
            # away. autocast=False: Keras would otherwise cast the whole table on every read.
            variable = self.add_weight(name=f"shards_w{width}", shape=(total_rows, width), dtype="float32",
                                       initializer=lambda shape, dtype, v=values: tf.constant(v), autocast=False)
            self.shard_variables.append(set_layout(mark(variable, VariableKind.SHARDED), self._layout(slices)))
            self.group_offsets.append(offsets)
        self.padding_variables = []
        if self.env.distributed and not self.groups and self.model_parallel:
            # A rank owning no slice still takes part in the alltoall and in its backward. Its
            # padding must depend on a variable the trainer differentiates, or TensorFlow prunes
            # this rank's backward alltoall and the other ranks wait for it forever.
            padding = self.add_weight(name="exchange_padding", shape=(1, 1), dtype="float32", initializer="zeros", trainable=False)
            self.padding_variables.append(set_layout(mark(padding, VariableKind.PADDING), self._layout([])))
        self.id_sink = None
        if self.env.distributed and self.data_parallel_input and not self.owned_tables and self.model_parallel:
            # This rank receives no ids in the id exchange; Grappler would prune an alltoall whose
            # (empty) result nobody reads, and the other ranks would wait forever: store it.
            self.id_sink = self.add_weight(name="id_sink", shape=(), dtype="int64", initializer="zeros", trainable=False)
        if self.replicated:
            self.replicated_offsets, total_rows = self._row_offsets(self.replicated)
            values = np.concatenate(
                [initial_table_slice(self.seed, t, self.cardinalities[t], self.embedding_dim) for t in self.replicated]
            )
            self.replicated_variable = self.add_weight(
                name="replicated", shape=(total_rows, self.embedding_dim), dtype="float32",
                initializer=lambda shape, dtype, v=values: tf.constant(v), autocast=False,
            )
            whole = [(0, self.embedding_dim)] * len(self.replicated)
            layout = SliceLayout(self.replicated, whole, [self.embedding_dim] * len(self.replicated))
            set_layout(mark(self.replicated_variable, VariableKind.REPLICATED), layout)

    @property
    def sparse_variables(self) -> list:
        return list(self.shard_variables)

    @property
    def dense_variables(self) -> list:
        return [self.replicated_variable] if self.replicated_variable is not None else []

    # ------------------------------------------------------------------ forward

    def _exchange_ids(self, local_ids) -> dict[int, tf.Tensor]:
        """Local batches of every table -> global batches of the tables this rank owns."""
        world = self.plan.world_size
        sends, splits = [], []
        for destination in range(world):
            tables = self.plan.tables_on_rank(destination)
            splits.append(len(tables))
            if tables:
                sends.append(tf.reshape(tf.stack([local_ids[t] for t in tables], axis=1), [-1]))
        local_batch = tf.shape(local_ids[0])[0]
        flat = tf.concat(sends, axis=0) if sends else tf.zeros([0], local_ids[0].dtype)
        if not self.env.distributed:
            received = flat
        else:
            static_batch = local_ids[0].shape[0]
            received = collectives.alltoall(self.env, flat, [static_batch * n for n in splits], name="id_exchange")
        owned = len(self.owned_tables)
        if self.id_sink is not None:
            self.id_sink.assign(tf.reduce_sum(tf.cast(received, tf.int64)))
        global_ids = tf.reshape(received, [world * local_batch, owned]) if owned else None
        return {t: global_ids[:, j] for j, t in enumerate(self.owned_tables)}

    def call(self, categorical, local_batch=None):
        """``local_batch`` (the local batch size) is needed only by a rank that reads no ids."""
        categorical = list(categorical)
        if local_batch is None:
            local_batch = self._local_batch_from(categorical)
        if self.data_parallel_input:
            global_ids = self._exchange_ids(categorical)
            replicated_ids = [categorical[t] for t in self.replicated]
        else:
            count = len(self.global_categorical)
            global_ids = dict(zip(self.global_categorical, categorical[:count]))
            replicated_ids = categorical[count:]
        parts = []
        if self.model_parallel:
            parts.append(self._model_parallel_lookup(global_ids, local_batch))
        if self.replicated:
            ids = self._fused_ids(replicated_ids, self.replicated_offsets)
            parts.append(tf.cast(gather_rows(self.replicated_variable, ids), self.compute_dtype))
        embeddings = tf.concat(parts, axis=1) if len(parts) > 1 else parts[0]
        return permute(embeddings, self.feature_order, axis=1)

    @staticmethod
    def _fused_ids(ids, offsets: np.ndarray) -> tf.Tensor:
        """``[batch, tables]`` row numbers in a fused variable: each table's ids plus its row offset."""
        dtype = tf.as_dtype(offsets.dtype)
        return tf.stack([tf.cast(i, dtype) for i in ids], axis=1) + offsets

    def _local_batch_from(self, categorical):
        if self.data_parallel_input or len(categorical) > len(self.global_categorical):
            return tf.shape(categorical[-1])[0]
        if categorical:
            return tf.shape(categorical[0])[0] // self.plan.world_size
        raise ValueError("This rank reads no ids: pass local_batch to DistributedEmbedding.call")

    def _model_parallel_lookup(self, global_ids: Mapping[int, tf.Tensor], local_batch) -> tf.Tensor:
        packed = []
        for (width, slices), variable, offsets in zip(self.groups, self.shard_variables, self.group_offsets):
            ids = self._fused_ids([global_ids[s.table] for s in slices], offsets)
            vectors = gather_rows(variable, ids)  # [B, slices, width]
            global_batch = tf.shape(vectors)[0]
            packed.append(tf.reshape(vectors, [global_batch, len(slices) * width]))
        # Cast before the exchange: under mixed precision the alltoall carries half the bytes.
        local_block = tf.cast(tf.concat(packed, axis=1), self.compute_dtype) if packed else None
        if self.env.distributed:
            if local_block is None:
                padding = tf.cast(self.padding_variables[0], self.compute_dtype)
                local_block = tf.tile(padding, [local_batch * self.plan.world_size, 1])
            received = self._exchange(local_block, local_batch)
            # Every source s sends this rank b rows of its width; b is the same for all sources.
            chunks = tf.split(received, [local_batch * w for w in self.send_widths], num=len(self.send_widths))
            block = tf.concat([tf.reshape(c, [local_batch, w]) for c, w in zip(chunks, self.send_widths)], axis=1)
        else:
            block = local_block
        mp = permute(block, self.permutation, axis=1)
        return tf.reshape(mp, [-1, len(self.model_parallel), self.embedding_dim])

    def _exchange(self, local_block: tf.Tensor, local_batch) -> tf.Tensor:
        """The embedding alltoall of ``local_block [B, W_r]`` (row block k to rank k), flattened."""
        flat = tf.reshape(local_block, [-1])
        if flat.dtype != tf.bfloat16:
            return collectives.alltoall(self.env, flat, name="embedding_exchange")
        world = self.plan.world_size
        static_batch = local_block.shape[0] // world if local_block.shape[0] is not None else tf.get_static_value(local_batch)
        if static_batch is None:
            # The gradient's routing needs the local batch size; unknown at trace time, exchange float32.
            received = collectives.alltoall(self.env, tf.cast(flat, tf.float32), name="embedding_exchange")
            return tf.cast(received, tf.bfloat16)
        return bfloat16_alltoall(self.env, flat, [int(static_batch) * w for w in self.send_widths], "embedding_exchange")

    def compute_output_shape(self, input_shape):
        return (None, self.num_tables, self.embedding_dim)

    # ------------------------------------------------------------------ full tables (collective)

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
        state_of = state_of or (lambda variable: variable)
        width = 1 if row_wise else self.embedding_dim
        if table in self.replicated:
            offset = int(self.replicated_offsets[self.replicated.index(table)])
            return state_of(self.replicated_variable)[offset:offset + rows].numpy() if self.env.is_chief else None
        mine = [tf.reshape(state_of(self.shard_variables[i])[o:o + rows], [-1]) for i, o, _ in self._my_pieces(table)]
        if self.env.distributed:
            # Everything goes to rank 0: an alltoall whose splits send all to rank 0 gathers to
            # the root. A rank holding none of this table sends one padding value (Horovod's
            # alltoall hangs on an empty send), which the root skips.
            flat = tf.concat(mine, axis=0) if mine else tf.zeros([1], tf.float32)
            splits = [int(flat.shape[0])] + [0] * (self.plan.world_size - 1)
            flat = collectives.alltoall(self.env, flat, splits, name=f"gather_table_{table}")
        else:
            flat = tf.concat(mine, axis=0)
        if not self.env.is_chief:
            return None
        full = np.empty((rows, width), np.float32)
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
        return full

    def set_full_table(self, table: int, values: np.ndarray | None, state_of=None, row_wise: bool = False) -> None:
        """Collective: rank 0 passes the full table (others None); each rank keeps what it owns.
        ``state_of`` and ``row_wise``: as in :meth:`get_full_table` (every slice of a row gets the
        row's row-wise state)."""
        rows = self.cardinalities[table]
        state_of = state_of or (lambda variable: variable)
        width = 1 if row_wise else self.embedding_dim
        if table in self.replicated:
            offset = int(self.replicated_offsets[self.replicated.index(table)])
            full = values if self.env.is_chief else np.zeros((rows, width), np.float32)
            full = collectives.broadcast(self.env, tf.constant(full, tf.float32), name=f"set_table_{table}")
            self._assign_rows(state_of(self.replicated_variable), offset, full)
            return
        if self.env.is_chief:
            values = np.asarray(values, np.float32)
            if values.shape != (rows, width):
                raise ValueError(f"table {table}: expected shape {(rows, width)}. Received: {values.shape}")
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
            received = collectives.alltoall(self.env, tf.constant(flat), splits, name=f"scatter_table_{table}").numpy()
        else:
            received = flat
        position = 0
        for index, offset, piece in self._my_pieces(table):
            piece_width = 1 if row_wise else piece.width
            size = rows * piece_width
            variable = state_of(self.shard_variables[index])
            self._assign_rows(variable, offset, received[position:position + size].reshape(rows, piece_width))
            position += size

    @staticmethod
    def _assign_rows(variable, offset: int, values) -> None:
        values = tf.convert_to_tensor(values, tf.float32)
        indices = tf.range(offset, offset + values.shape[0], dtype=tf.int64)
        target = variable if isinstance(variable, tf.Variable) else variable.value
        target.scatter_update(tf.IndexedSlices(values, indices))

    def get_config(self):
        return {
            **super().get_config(),
            "plan": self.plan.to_dict(),
            "rank": self.env.rank,
            "seed": self.seed,
            "data_parallel_input": self.data_parallel_input,
        }
