"""The dynamic embedding layer: raw int64 keys in, ``[local_batch, T, D]`` vectors out.

Every rank reads its local batch of every dynamic feature (as ``--data_parallel_input``). One
step on rank r of N:

1. each key goes to the rank holding its shard (``owner_shard(key) mod N``): the (table, key) pairs
   are sorted by destination and sent with one ``alltoall`` (one padding pair per destination:
   Horovod's alltoall hangs when a rank sends nothing to a rank);
2. the owner looks the keys up in its shards (in training: inserting, admitting and evicting, see
   :mod:`tf_dlrm.embedding.dynamic.shard_state`) and gathers their rows from the shard's storage;
3. a second ``alltoall`` with the received sizes returns the vectors, unsorted back to batch order.

Gradients take the same way back (the backward of Horovod's alltoall), arriving at the storage as
``IndexedSlices`` summed over ranks; the storage variables are marked ``sharded``, so the trainer's
sparse optimizer updates them like fixed shards (scaled ``1/N``). Their optimizer state is shaped
like the storage and so lives with the row; a row (re)assigned to a key gets its optimizer state
reset to the optimizer's initial values (:meth:`DynamicEmbedding.attach_optimizer_state`).

A key without a row (evaluation of an unseen key, a key not yet admitted, a key rejected by a
full shard) reads zeros and gets no gradient.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import keras
import numpy as np
import tensorflow as tf

from tf_dlrm.embedding.table_config import Combiner, TableConfig
from tf_dlrm.parallel import collectives
from tf_dlrm.parallel.env import DistributedEnv
from tf_dlrm.embedding.dynamic import hashing
from tf_dlrm.sharding.dynamic_routing import shards_of_rank
from tf_dlrm.embedding.dynamic.shard_state import ShardState
from tf_dlrm.embedding.variable_kind import VariableKind, mark
from tf_dlrm.optimizers.sparse_optimizer import tf_variable

KEY_DTYPES = (tf.int32, tf.int64)


def as_dynamic_table(table) -> TableConfig:
    """A :class:`TableConfig` (or its ``to_dict()``) placed as dynamic (``Placement(dynamic=DynamicStorage(...))``)."""
    table = table if isinstance(table, TableConfig) else TableConfig.from_dict(table)
    if not table.dynamic:
        raise ValueError(f"Expected dynamic tables (placement=Placement(dynamic=DynamicStorage(...))). "
                         f"Received: table {table.name!r} with placement {table.placement}")
    return table


def rows_per_shard(table: TableConfig, num_shards: int) -> int:
    """A shard's rows: the capacity, or with ``capacity_scope="total"`` its share of it."""
    storage = table.placement.dynamic
    return -(-storage.capacity // num_shards) if storage.capacity_scope == "total" else storage.capacity


def new_row_bound(table: TableConfig) -> float:
    """New rows are uniform in ``[-b, b]``: the table's initializer, or for ``"uniform_sqrt_rows"``
    ``1/sqrt(capacity)`` (the DLRM initialisation of a fixed table of that many rows)."""
    bound = table.init_bound
    return 1.0 / math.sqrt(table.placement.dynamic.capacity) if bound is None else float(bound)


@keras.saving.register_keras_serializable(package="tf_dlrm")
class DynamicEmbedding(keras.layers.Layer):
    """One feature per dynamic table, keyed by raw int64 keys; called with ``{table name: keys}``, each ``[batch]``
    (one-hot), ``[batch, hotness]`` or ragged ``[batch, None]`` (multi-hot, pooled by the table's combiner).

    Args:
        tables: dynamic :class:`TableConfig` objects (or their dicts), one per feature, one width for all.
        combiners: how each table's multi-hot keys pool (``sum``, ``mean``, ``sqrtn``; default ``sum``); a key
            without a row adds zeros and counts for ``mean`` and ``sqrtn``, as an id of a fixed table does.
        rank, world_size: this process's place.
        num_shards: shards of every table (default ``world_size``); shard ``s`` lives on rank
            ``s mod world_size``. One process with ``num_shards=N`` takes the same insertion and
            eviction decisions as ``N`` ranks.
        seed: new rows' values come from ``(seed, table, key)``.
    """

    def __init__(self, tables: Sequence, rank: int = 0, world_size: int = 1, num_shards: int | None = None,
                 seed: int = 0, combiners: Sequence[str] | None = None, **kwargs):
        super().__init__(**kwargs)
        self.table_configs = tuple(as_dynamic_table(t) for t in tables)
        if not self.table_configs:
            raise ValueError("Expected at least one dynamic table. Received: tables=[]")
        self.combiners = tuple(Combiner(c).value for c in (combiners or ["sum"] * len(self.table_configs)))
        if len(self.combiners) != len(self.table_configs):
            raise ValueError(f"Expected one combiner per dynamic table. Received: {list(self.combiners)}")
        widths = {t.embedding_dim for t in self.table_configs}
        if len(widths) != 1:
            raise ValueError(f"Expected one width for every dynamic table. Received: "
                             f"{ {t.name: t.embedding_dim for t in self.table_configs} }")
        self.embedding_dim = widths.pop()
        self.env = DistributedEnv(rank=rank, world_size=world_size)
        self.num_shards = int(num_shards or world_size)
        self.local_shards = shards_of_rank(rank, world_size, self.num_shards)
        self.seed = int(seed)
        self.feature_widths = tuple(t.embedding_dim for t in self.table_configs)
        capacities = [rows_per_shard(t, self.num_shards) for t in self.table_configs]
        self.row_offsets = tuple(int(o) for o in np.cumsum([0] + capacities))
        self.states = {
            shard: [ShardState(capacity, t.placement.dynamic.eviction, t.placement.dynamic.min_count,
                               f"{self.name}_{t.name}_shard{shard}", t.placement.dynamic.max_idle_steps)
                    for t, capacity in zip(self.table_configs, capacities)]
            for shard in self.local_shards
        }
        self.training_step = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{self.name}_step")
        self.storage = {}
        self._slot_resets = {}

    # Read by the trainer's checkpointing and reporting, which treat dynamic tables apart.
    dynamic = True

    def build(self, input_shape=None):
        for shard in self.local_shards:
            # float32 whatever the compute dtype: small sparse updates round away in bf16/fp16.
            variable = self.add_weight(name=f"storage_shard{shard}", shape=(self.row_offsets[-1], self.embedding_dim),
                                       dtype="float32", initializer="zeros")
            self.storage[shard] = mark(variable, VariableKind.SHARDED)

    def attach_optimizer_state(self, sparse_updater) -> None:
        """Remembers the storage's optimizer state, so that a row given to a new key restarts from
        the optimizer's initial state (an evicted key's state leaves with it)."""
        initial = sparse_updater.optimizer.slots
        self._slot_resets = {
            shard: [(sparse_updater.slot(variable, name), float(initial[name])) for name in sparse_updater.slot_names]
            for shard, variable in self.storage.items()
        }

    @property
    def sparse_variables(self) -> list:
        return [self.storage[s] for s in self.local_shards]

    @property
    def dense_variables(self) -> list:
        return []

    # ------------------------------------------------------------------ the lookup

    def call(self, inputs, training=False):
        names = [t.name for t in self.table_configs]
        if not isinstance(inputs, Mapping) or sorted(inputs) != sorted(names):
            raise ValueError(f"Expected the keys of every dynamic table {names} by table name. Received: "
                             f"{sorted(inputs) if isinstance(inputs, Mapping) else type(inputs).__name__}")
        # Every table's keys flat, one table after the other: the exchange and the shards take (table, key) pairs
        # in any order (each shard resolves a step's distinct keys sorted), so one path serves one-hot and multi-hot.
        flat = [_flat_keys(name, inputs[name]) for name in names]
        keys = tf.concat([values for values, _, _ in flat], axis=0)
        tables = tf.concat([tf.fill(tf.shape(values, out_type=tf.int64), tf.constant(t, tf.int64))
                            for t, (values, _, _) in enumerate(flat)], axis=0)
        if training:
            self.training_step.assign_add(1)
        if not self.env.distributed:
            vectors = self._owner_lookup(tables, keys, bool(training))
        else:
            vectors = self._exchanged_lookup(tables, keys, bool(training))
        pieces = tf.split(vectors, [tf.shape(values)[0] for values, _, _ in flat], axis=0, num=len(flat))
        pooled = [_pooled(piece, rows, samples, combiner)
                  for piece, (_, rows, samples), combiner in zip(pieces, flat, self.combiners)]
        return tf.cast(tf.stack(pooled, axis=1), self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return (None, len(self.table_configs), self.embedding_dim)

    def _exchanged_lookup(self, tables, keys, training):
        world = self.env.world_size
        destination = hashing.owner_shard(keys, self.num_shards) % world
        everyone = tf.range(world, dtype=tf.int64)
        destination = tf.concat([destination, everyone], axis=0)
        tables = tf.concat([tables, -tf.ones([world], tf.int64)], axis=0)  # padding pairs: table -1
        keys = tf.concat([keys, tf.zeros([world], tf.int64)], axis=0)
        order = tf.argsort(destination, stable=True)
        payload = tf.stack([tf.gather(tables, order), tf.gather(keys, order)], axis=1)
        splits = tf.math.bincount(tf.cast(destination, tf.int32), minlength=world, maxlength=world)
        received, received_splits = collectives.alltoall_with_splits(self.env, payload, splits, name=f"{self.name}_keys")
        vectors = self._owner_lookup(received[:, 0], received[:, 1], training)
        returned = collectives.alltoall(self.env, vectors, received_splits, name=f"{self.name}_vectors")
        real = tf.shape(keys)[0] - world
        return tf.gather(returned, tf.math.invert_permutation(order))[:real]

    def _owner_lookup(self, tables, keys, training):
        """``[m, D]`` vectors of the received (table, key) pairs (table -1: padding, zeros)."""
        size = tf.shape(keys, out_type=tf.int64)[0]
        shard_of = hashing.owner_shard(keys, self.num_shards)
        positions, vectors = [], []
        for shard in self.local_shards:
            shard_positions, shard_rows = [], []
            for table, state in enumerate(self.states[shard]):
                place = tf.reshape(tf.where((tables == table) & (shard_of == shard)), [-1])
                entry_keys = tf.gather(keys, place)
                ascending = tf.argsort(entry_keys, stable=True)
                unique, index = tf.unique(tf.gather(entry_keys, ascending), out_idx=tf.int64)
                if training:
                    counts = tf.math.unsorted_segment_sum(tf.ones_like(index), index, tf.shape(unique, out_type=tf.int64)[0])
                    rows, new_rows, new_keys = state.resolve(unique, counts, self.training_step)
                    self._initialise_rows(shard, table, new_rows, new_keys)
                else:
                    rows = state.lookup(unique)
                entry_rows = tf.gather(rows, index)  # in ascending-key order of the entries
                valid = entry_rows >= 0
                shard_positions.append(tf.gather(place, tf.boolean_mask(ascending, valid)))
                shard_rows.append(tf.boolean_mask(entry_rows, valid) + self.row_offsets[table])
            positions.append(tf.concat(shard_positions, axis=0))
            vectors.append(tf.gather(tf_variable(self.storage[shard]), tf.concat(shard_rows, axis=0)))
        return tf.scatter_nd(tf.concat(positions, axis=0)[:, None], tf.concat(vectors, axis=0),
                             tf.stack([size, tf.constant(self.embedding_dim, tf.int64)]))

    def _initialise_rows(self, shard, table, new_rows, new_keys):
        config = self.table_configs[table]
        fused = new_rows + self.row_offsets[table]
        values = hashing.initial_rows(new_keys, self.seed, table, config.embedding_dim, new_row_bound(config))
        tf_variable(self.storage[shard]).scatter_nd_update(fused[:, None], values)
        for slot, initial in self._slot_resets.get(shard, ()):
            width = slot.shape[1]
            slot.scatter_nd_update(fused[:, None], tf.fill(tf.stack([tf.shape(fused)[0], width]), initial))

    # ------------------------------------------------------------------ state

    def counters(self) -> dict:
        """This rank's ``{table: {"evictions": n, "rejections": n, "rows": n}}``."""
        result = {}
        for table, config in enumerate(self.table_configs):
            states = [self.states[s][table] for s in self.local_shards]
            result[config.name] = {
                "evictions": int(sum(int(s.evictions.numpy()) for s in states)),
                "rejections": int(sum(int(s.rejections.numpy()) for s in states)),
                "rows": int(sum(int(tf.reduce_sum(tf.cast(s.occupied, tf.int64)).numpy()) for s in states)),
            }
        return result

    def global_counters(self) -> dict:
        """Collective: :meth:`counters` summed over ranks (the figures the logs report)."""
        local = self.counters()
        names = [t.name for t in self.table_configs]
        flat = np.array([[local[n]["evictions"], local[n]["rejections"], local[n]["rows"]] for n in names], np.int64)
        total = collectives.sum_over_ranks(self.env, tf.constant(flat), name=f"{self.name}_counters").numpy()
        return {n: dict(zip(("evictions", "rejections", "rows"), map(int, row))) for n, row in zip(names, total)}

    def local_rows(self, table: int, state_of=None) -> tuple[np.ndarray, np.ndarray]:
        """This rank's ``(keys [n], values [n, w])`` of ``table`` (or of an optimizer state of it)."""
        keys, values = [], []
        for shard in self.local_shards:
            exported = self.states[shard][table].export()
            variable = self.storage[shard] if state_of is None else state_of(self.storage[shard])
            keys.append(exported["keys"])
            values.append(tf.gather(tf_variable(variable), exported["rows"] + self.row_offsets[table]).numpy())
        return np.concatenate(keys), np.concatenate(values)

    def get_config(self):
        return {**super().get_config(), "tables": [t.to_dict() for t in self.table_configs], "rank": self.env.rank,
                "world_size": self.env.world_size, "num_shards": self.num_shards, "seed": self.seed,
                "combiners": list(self.combiners)}


def _flat_keys(name: str, ids):
    """``(keys [n] int64, sample of each key [n] or None for one key per sample, samples)`` of one feature's ids."""
    if ids.dtype not in KEY_DTYPES:
        raise ValueError(f"Expected int64 (or int32) keys for dynamic feature {name!r}. Received: dtype={ids.dtype.name}")
    if isinstance(ids, tf.RaggedTensor):
        return tf.cast(ids.values, tf.int64), tf.cast(ids.value_rowids(), tf.int64), tf.cast(ids.nrows(), tf.int64)
    if ids.shape.rank == 2:
        samples, hotness = tf.shape(ids, out_type=tf.int64)[0], tf.shape(ids, out_type=tf.int64)[1]
        return tf.cast(tf.reshape(ids, [-1]), tf.int64), tf.repeat(tf.range(samples), hotness), samples
    return tf.cast(tf.reshape(ids, [-1]), tf.int64), None, None


def _pooled(vectors, rows, samples, combiner: str):
    """One vector per sample: the key's own (one-hot), or the pool of its keys' vectors."""
    if rows is None:
        return vectors
    total = tf.math.unsorted_segment_sum(vectors, rows, samples)
    if combiner == Combiner.SUM.value:
        return total
    count = tf.math.unsorted_segment_sum(tf.ones_like(rows, vectors.dtype), rows, samples)[:, None]
    return tf.math.divide_no_nan(total, count if combiner == Combiner.MEAN.value else tf.sqrt(count))
