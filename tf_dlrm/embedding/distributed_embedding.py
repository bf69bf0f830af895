"""DistributedEmbedding: executes a ShardingPlan for a list of features; holds only this rank's shards.

Features and tables. Each feature (a :class:`tf_dlrm.embedding.FeatureConfig`) reads one
table; several features may read the same table; a feature may be one-hot, fixed multi-hot or
ragged, pooled by ``sum``, ``mean`` or ``sqrtn``, weighted (a weight per id, passed beside the ids
in ``call(inputs, weights)``), or a sequence (no combiner: ``[b, hotness, dim]``, run as one-id
features by position, :mod:`tf_dlrm.embedding.sequence_features`); tables may have different widths.

Storage. The slices this rank owns, and the replicated tables, are fused by width into a few
variables (:mod:`tf_dlrm.embedding.fused_variables`), so one gather serves many tables.

Forward on rank r of N (global batch B, local batch b = B / N):

1. for every feature reading an owned slice, look up and **pool** the global batch of its ids
   (:func:`tf_dlrm.embedding.pooling.pooled_lookup`) -> packed side by side ``[B, W_r]``, one
   column block per (feature, slice) (the order is :mod:`tf_dlrm.sharding.packing`): a
   multi-hot feature costs the exchange bytes of a one-hot one;
2. one ``hvd.alltoall`` sends row block k (``b`` rows) to rank k; rank r receives ``[b, W_s]``
   from every source s and puts them side by side;
3. replicated tables look up and pool the local batch directly; the two parts are joined and
   permuted once into feature order -> ``[b, sum of feature widths]`` (``[b, F, D]`` when all
   widths are ``D``).

With ``data_parallel_input`` every rank reads its local batch of every feature and alltoalls of
ids (:mod:`tf_dlrm.embedding.id_exchange`) give each rank the global batch of the features whose
tables it owns.

The backward of the alltoall (registered by Horovod) returns to each shard the sum over ranks of
its gradient, i.e. N times the gradient of the global mean loss: the trainer scales shard
gradients by 1/N. The pooling's backward sends the pooled gradient to every id (duplicates kept,
accumulated by the sparse update).

tf_dlrm's embedding-bag kernel (:mod:`tf_dlrm.ops.embedding_bag`), when built, pools every
fused variable that has a multi-hot feature (and no column-sliced table) in one op, checks its ids
(naming the feature), and returns a gradient over distinct rows; in one process every variable is
pooled by a single op straight into feature order. The layer reads each variable once per call.
"""

from __future__ import annotations

from typing import Mapping

import keras
import numpy as np
import tensorflow as tf

from tf_dlrm.ops.assemble import assemble_columns, assemble_kernel, assembly_layout
from tf_dlrm.parallel.env import current_env
from tf_dlrm.embedding.dedup_exchange import deduplicated_exchange
from tf_dlrm.ops.embedding_bag import bag_kernel, mark_distinct_rows, multi_table_bag_lookup
from tf_dlrm.embedding.full_tables import FullTableAccess
from tf_dlrm.embedding.fused_variables import FusedVariables
from tf_dlrm.embedding.hot_row_layer import HotRowReplicas
from tf_dlrm.embedding.exchange import exchange_block, permute
from tf_dlrm.embedding.id_exchange import exchange_ids
from tf_dlrm.sharding.packing import (
    band_permutations,
    group_entries,
    output_permutation,
    packing_groups,
    received_labels,
    replicated_groups,
    replicated_labels,
    send_width,
)
from tf_dlrm.sharding.plan import ShardingPlan
from tf_dlrm.embedding.pooling import band_entry, normalize_ids, normalize_weights, pooled_lookup
from tf_dlrm.embedding.split_tables import check_split_options
from tf_dlrm.embedding.dynamic.layer import DynamicEmbedding
from tf_dlrm.embedding.planning import DEFAULT_DATA_PARALLEL_ROWS, plan_tables
from tf_dlrm.embedding.sequence_features import expand_sequences, position_name, split_positions
from tf_dlrm.embedding.table_config import TableConfig, as_feature_config, feature_tables, tables_of
from tf_dlrm.embedding.variable_kind import VariableKind, mark, set_layout


@keras.saving.register_keras_serializable(package="tf_dlrm")
class DistributedEmbedding(FusedVariables, FullTableAccess, HotRowReplicas, keras.layers.Layer):
    """Embedding tables sharded table-wise, column-wise and row-wise over ranks, pooled per feature.

    Args:
        feature_configs: :class:`FeatureConfig` (or dicts), a list in input order or a dict of them; each
            holds its :class:`TableConfig` (the tables come from the features, in order of first use).
        seed: initial values depend only on ``(seed, table)``.
        data_parallel_input: read local batches of every feature and exchange ids (see module doc).
        validate_ids: check every id against its table's rows (and ragged rows against hotness).
        deduplicate_exchange: send each destination one row per distinct id of its samples and the
            samples' indices (:mod:`tf_dlrm.embedding.dedup_exchange`) instead of one row per
            sample; one-hot features only, every rank owning a slice; the rows travel in float32.
        use_kernel: pool with tf_dlrm's embedding-bag kernel when it is built (see module doc);
            False keeps plain TensorFlow ops (the same values; benchmarks compare the two).
        strategy, data_parallel_threshold, column_slice_threshold, row_slice_threshold: how the planner places the
            tables whose placement is ``auto`` (:func:`tf_dlrm.sharding.planner.make_plan`; a table of more than
            ``row_slice_threshold`` elements is cut into row bands over every rank, as NVIDIA's
            distributed-embeddings does); unused when ``plan`` is given.
            On several ranks, tables of fewer than ``data_parallel_threshold`` rows (default 2048, as
            ``main.py``'s ``--data_parallel_rows``) are replicated.
        plan: a :class:`ShardingPlan` (or its ``to_dict()``) of the features' tables, in their order, to execute
            instead of planning (``main.py`` plans once for its memory checks and hands the plan on).
        env: this process's rank and world size (a :class:`tf_dlrm.parallel.env.DistributedEnv`); default
            :func:`tf_dlrm.parallel.env.current_env` (Horovod's ranks under horovodrun, else one process).
        dynamic_shards: shards of the dynamic tables (default one per rank).
    """

    def __init__(self, feature_configs, *, seed: int = 0, data_parallel_input: bool = True, validate_ids: bool = True,
                 deduplicate_exchange: bool = False, use_kernel: bool = True, strategy: str = "auto",
                 data_parallel_threshold: int = DEFAULT_DATA_PARALLEL_ROWS, column_slice_threshold: int | None = None,
                 plan=None, env=None, dynamic_shards: int | None = None, row_slice_threshold: int | None = None, **kwargs):
        super().__init__(**kwargs)
        if isinstance(feature_configs, Mapping):
            feature_configs = list(feature_configs.values())
        self.features = tuple(as_feature_config(f) for f in feature_configs)
        if not self.features:
            raise ValueError("Expected at least one feature. Received: feature_configs=()")
        unsupported = [f.name for f in self.features if (f.weighted or f.sequence)
                       and isinstance(f.table, TableConfig) and f.table.dynamic]
        if unsupported:
            raise ValueError(f"Weighted and sequence features read fixed tables only. Received: {unsupported} "
                             "reading dynamic tables")
        # The user's features, in output order; self.features becomes the internal ones (a sequence
        # feature's positions in its place).
        self.user_features = self.features
        self.features, self.feature_positions = expand_sequences(self.features)
        self.env = env if env is not None else current_env()
        self.strategy, self.data_parallel_threshold = strategy, int(data_parallel_threshold)
        self.column_slice_threshold, self.row_slice_threshold = column_slice_threshold, row_slice_threshold
        self.table_configs, self.dynamic_layer = None, None
        # Set by the training step while it traces: a user's model need not pass ``training`` down.
        self.training_default = None
        self.output_features = self.user_features  # every feature, in the order of the output dict
        # Tables come from the features: the plan follows the placements.
        self.table_configs = tables_of(self.features)
        if any(t.dynamic for t in self.table_configs):
            self._make_dynamic_layer(seed, dynamic_shards)
            if not self.features:
                self._init_dynamic_only(seed, data_parallel_input, validate_ids, deduplicate_exchange, use_kernel)
                return
        # The user's features on fixed tables, each to its internal positions.
        dynamic_names = {f.name for f in getattr(self, "dynamic_features", ())}
        self.static_features = tuple(f for f in self.user_features if f.name not in dynamic_names)
        self.features, self.feature_positions = expand_sequences(self.static_features)
        # Weighted and sequence features' ids are checked once, as the user gave them (_internal_inputs).
        self.checked_on_input = frozenset(f for feature, positions in zip(self.static_features, self.feature_positions)
                                          if feature.weighted or feature.sequence for f in positions)
        if plan is None:
            plan = plan_tables(self.table_configs, self.features, self.env.world_size, strategy=strategy,
                               data_parallel_threshold=data_parallel_threshold,
                               column_slice_threshold=column_slice_threshold, row_slice_threshold=row_slice_threshold,
                               unplanned=getattr(self, "dynamic_table_configs", ()))
        plan = plan if isinstance(plan, ShardingPlan) else ShardingPlan.from_dict(plan)
        given = [(t.name, t.rows, t.dim) for t in plan.tables]
        if given != [(t.name, t.vocabulary_size, t.embedding_dim) for t in self.table_configs]:
            raise ValueError(f"Expected a plan of the features' tables. Received: a plan of {given}")
        hot_rows = {t: list(c.placement.hot_rows) for t, c in enumerate(self.table_configs) if c.placement.hot_rows}
        storage = {c.placement.storage for t, c in enumerate(self.table_configs) if t in set(plan.model_parallel)}
        if len(storage) > 1:
            raise ValueError("Expected one storage for every model-parallel table (split bfloat16 tables are fused "
                             f"with the others). Received: {sorted(storage)}")
        self.plan = plan
        if self.plan.world_size != self.env.world_size:
            raise ValueError(f"Expected a plan for the {self.env.world_size} ranks of this run. "
                             f"Received: a plan for {self.plan.world_size}")
        table_names = [t.name for t in self.plan.tables]
        rank = self.env.rank
        self.table_init_bounds = tuple(t.init_bound for t in self.table_configs)
        self.feature_tables = feature_tables(self.features, table_names)
        self.feature_widths = tuple(self.plan.tables[t].dim for t in self.feature_tables)
        widths = set(self.feature_widths)
        # One width for all features: the output is [b, F, D] (DLRM's interaction wants that).
        self.embedding_dim = widths.pop() if len(widths) == 1 else None
        self.seed = int(seed)
        self.data_parallel_input = bool(data_parallel_input)
        self.validate_ids = bool(validate_ids)
        self.use_kernel = bool(use_kernel)
        self.num_tables = len(self.plan.tables)
        self.num_features = len(self.features)
        self.cardinalities = tuple(t.rows for t in self.plan.tables)
        self.model_parallel = tuple(self.plan.model_parallel)
        self.replicated = tuple(self.plan.replicated)
        self.owned_tables = tuple(self.plan.tables_on_rank(rank))
        replicated = set(self.replicated)
        self.features_on_rank = [tuple(f for f, t in enumerate(self.feature_tables) if t in set(self.plan.tables_on_rank(r)))
                                 for r in range(self.plan.world_size)]
        self.replicated_features = tuple(f for f, t in enumerate(self.feature_tables) if t in replicated)
        self.exchanges = any(t not in replicated for t in self.feature_tables)
        if self.data_parallel_input:
            self.global_categorical, self.local_categorical = (), tuple(range(self.num_features))
        else:
            self.global_categorical = self.features_on_rank[rank]
            self.local_categorical = self.replicated_features
        self.groups = packing_groups(self.plan, rank)
        self.entries = [group_entries(slices, self.feature_tables) for _, slices in self.groups]
        self.replicated_groups = replicated_groups(self.plan)
        self.replicated_entries = [group_entries(slices, self.feature_tables) for _, slices in self.replicated_groups]
        self.send_widths = [max(1, send_width(self.plan, r, self.feature_tables)) for r in range(self.plan.world_size)]
        labels = (received_labels(self.plan, self.feature_tables) if self.exchanges else [])
        labels += replicated_labels(self.plan, self.feature_tables)
        self.permutation = np.array(output_permutation(self.plan, self.feature_tables, labels), dtype=np.int32)
        # Row-sliced tables: every band's pooled vectors arrive; the output adds them (band 0 is permuted above).
        self.row_sliced = frozenset(self.plan.row_sliced)
        self.band_permutations = [np.array(p, np.int32) for p in band_permutations(self.plan, self.feature_tables, labels)]
        self._check_row_bands(storage, deduplicate_exchange)
        self.deduplicate_exchange = bool(deduplicate_exchange)
        if self.deduplicate_exchange:
            self.source_entry_widths = [[slices[p].width for _, slices in packing_groups(self.plan, r)
                                         for _, p in group_entries(slices, self.feature_tables)] for r in range(self.plan.world_size)]
            problems = [f.name for f in self.features if not f.one_hot]
            if problems or not all(self.source_entry_widths) or self.data_parallel_input:
                raise ValueError("deduplicate_exchange (--deduplicate_exchange) needs one-hot features, every rank owning "
                                 "a slice (more model-parallel tables than ranks, or --dist_strategy=column_wise) and no "
                                 f"--data_parallel_input. Received: multi-hot features {problems}, entries per rank "
                                 f"{[len(w) for w in self.source_entry_widths]}, data_parallel_input={self.data_parallel_input}")
        self.shard_variables, self.replicated_variables = [], []
        self._init_hot_rows(hot_rows)
        self.split_embedding_tables = storage == {"split_bfloat16"}
        if self.split_embedding_tables:
            check_split_options(self.compute_dtype, bool(self.hot_rows), self.deduplicate_exchange)

    def _check_row_bands(self, storage, deduplicate_exchange) -> None:
        """Row-sliced tables take float32 storage and no deduplicated exchange: refused in one line."""
        if not self.row_sliced:
            return
        names = [self.plan.tables[t].name for t in sorted(self.row_sliced)]
        problems = []
        if deduplicate_exchange:
            problems.append("deduplicate_exchange (--deduplicate_exchange)")
        if storage == {"split_bfloat16"}:
            problems.append("split bfloat16 storage (--split_embedding_tables)")
        if problems:
            raise ValueError(f"Row-sliced tables {names} cannot be combined with {', '.join(problems)}: keep them whole "
                             "or column-sliced (placement 'auto' without --row_slice_threshold, or 'column_wise')")

    def _make_dynamic_layer(self, seed: int, num_shards: int | None) -> None:
        """Dynamic tables (``Placement(dynamic=...)``) live in a :class:`DynamicEmbedding` inside this
        layer, keyed by raw int64 keys and sharded by key hash (``num_shards`` shards, default one per
        rank); the others follow the plan."""
        dynamic = [t for t in self.table_configs if t.dynamic]
        names = {t.name for t in dynamic}
        readers = [f for f in self.features if f.table_name in names]
        if len(readers) != len(dynamic):
            raise ValueError("Expected one feature per dynamic table (its int64 keys). Received: features "
                             f"{[(f.name, f.table_name) for f in readers]} for dynamic tables {sorted(names)}")
        static = [f for f in self.features if f.table_name not in names]
        self.dynamic_features = tuple(readers)
        self.dynamic_layer = DynamicEmbedding([f.table for f in readers], rank=self.env.rank, world_size=self.env.world_size,
                                              num_shards=num_shards, seed=seed, combiners=[f.combiner for f in readers],
                                              name=f"{self.name}_dynamic")
        self.features = tuple(static)
        self.table_configs = tables_of(self.features)
        self.dynamic_table_configs = tuple(f.table for f in readers)

    def _init_dynamic_only(self, seed: int, data_parallel_input: bool, validate_ids: bool, deduplicate_exchange: bool,
                           use_kernel: bool) -> None:
        """Every table dynamic (``main.py --keys=hashed``): the layer is its inner :class:`DynamicEmbedding`
        (no plan, no fixed variables)."""
        layer = self.dynamic_layer
        self.features = self.dynamic_features
        self.static_features, self.feature_positions, self.checked_on_input = (), (), frozenset()
        self.plan, self.seed = None, int(seed)
        self.data_parallel_input, self.validate_ids = bool(data_parallel_input), bool(validate_ids)
        self.deduplicate_exchange, self.use_kernel = bool(deduplicate_exchange), bool(use_kernel)
        self.feature_widths, self.embedding_dim = tuple(layer.feature_widths), layer.embedding_dim
        self.num_features = len(self.features)
        self.global_categorical, self.local_categorical = (), tuple(range(self.num_features))
        self.shard_variables, self.replicated_variables, self.padding_variables = [], [], []
        self.hot_rows, self.hot_tables, self.hot_variables = {}, (), []
        self.split_embedding_tables = False

    @property
    def output_widths(self) -> tuple:
        """The width of each output feature (of each position of a sequence feature), in :attr:`output_features`' order (what a model on this layer reads;
        :attr:`feature_widths` are the planned features' alone when dynamic tables sit beside fixed ones)."""
        if self.dynamic_layer is None or self.dynamic_only:
            return tuple(self.feature_widths)
        widths = dict(zip((f.name for f in self.features), self.feature_widths))
        widths.update(zip((f.name for f in self.dynamic_features), self.dynamic_layer.feature_widths))
        # A sequence feature: one width per position (its positions are features of the stacked output).
        return tuple(widths[position_name(f.name, i) if f.sequence else f.name]
                     for f in self.output_features for i in range(f.hotness if f.sequence else 1))

    @property
    def output_dim(self) -> int | None:
        """The one width of every output feature (the stacked output is then ``[b, F, D]``), else None."""
        widths = set(self.output_widths)
        return widths.pop() if len(widths) == 1 else None

    @property
    def dynamic_only(self) -> bool:
        """Whether every table is dynamic (the layer then runs its :attr:`dynamic_layer` alone)."""
        return self.dynamic_layer is not None and self.plan is None

    def table_optimizers(self) -> dict:
        """``{table index: table optimizer object}`` (:mod:`tf_dlrm.embedding.optimizers`; None: the step's)."""
        return {t: config.optimizer for t, config in enumerate(self.table_configs)}

    def frequency_regularizers(self) -> dict:
        """``{table index: FrequencyRegularizer or None}`` of the tables made from configs."""
        return {t: config.frequency_regularizer for t, config in enumerate(self.table_configs or ())}

    def dynamic_optimizers(self) -> list:
        """The optimizer objects of the dynamic tables (their rows train with the step's base optimizer)."""
        return [t.optimizer for t in getattr(self, "dynamic_table_configs", ())]

    def table_init_bound(self, table: int) -> float | None:
        return self.table_init_bounds[table]

    # ------------------------------------------------------------------ weights

    def _pools_with_kernel(self, slices, entries) -> bool:
        """Whether a fused variable is read through tf_dlrm's embedding-bag kernel
        (:mod:`tf_dlrm.ops.embedding_bag`): when the library is loaded, the variable has a
        multi-hot feature (all one-hot: one plain gather is as fast), and none of its slices is
        part of a column-sliced table (row-wise optimizer state there needs each lookup's position
        in the batch, which the kernel's gradient over distinct rows does not keep)."""
        if not any(not self.features[f].one_hot for f, _ in entries):
            return False
        if any(self.features[f].weighted for f, _ in entries):  # the kernel takes no weights
            return False
        if any(len(self.plan.table_slices(s.table)) > 1 for s in slices):
            return False
        return self.use_kernel and bag_kernel() is not None and not self.split_embedding_tables

    def build(self, input_shape=None):
        if self.dynamic_layer is not None and not self.dynamic_layer.built:
            self.dynamic_layer.build()
        if self.dynamic_only:
            return
        self.group_offsets, self.replicated_offsets = [], []
        self._group_kernel, self._replicated_kernel = [], []
        for (width, slices), entries in zip(self.groups, self.entries):
            variable, offsets = self._fused_variable(f"shards_w{width}", slices, VariableKind.SHARDED)
            self.shard_variables.append(variable)
            self.group_offsets.append(offsets)
            self._group_kernel.append(self._pools_with_kernel(slices, entries) and not self.deduplicate_exchange)
        for (width, slices), entries in zip(self.replicated_groups, self.replicated_entries):
            variable, offsets = self._fused_variable(f"replicated_w{width}", slices, VariableKind.REPLICATED)
            self.replicated_variables.append(variable)
            self.replicated_offsets.append(offsets)
            self._replicated_kernel.append(self._pools_with_kernel(slices, entries))
        # Read once per call by the kernel: their gradients' rows are distinct (the sparse update
        # skips its own deduplication).
        for variable, kernel in zip(self.shard_variables + self.replicated_variables, self._group_kernel + self._replicated_kernel):
            if kernel:
                mark_distinct_rows(variable)
        # A multi-hot feature of a whole (not column-sliced) table is pooled by the kernel on
        # whichever rank owns it (_pools_with_kernel), which checks its ids there.
        self._kernel_checked_features = frozenset(
            f for f, feature in enumerate(self.features)
            if not feature.one_hot and not feature.weighted and len(self.plan.table_slices(self.feature_tables[f])) == 1 and self.use_kernel
            and bag_kernel() is not None and not self.split_embedding_tables)
        # One process with a multi-hot feature and no column-sliced table: every variable, the
        # one-hot features' included, is pooled by one kernel op writing feature order directly (no
        # per-width blocks, concat or permutation, forward or backward).
        self._single_op = (not self.env.distributed and not self.data_parallel_input and bool(self._kernel_checked_features)
                          and not any(f.weighted for f in self.features)
                          and all(len(self.plan.table_slices(t)) == 1 for t in set(self.feature_tables)))
        if self.single_op:
            for variable in self.shard_variables + self.replicated_variables:
                mark_distinct_rows(variable)
            self._kernel_checked_features = frozenset(range(self.num_features))
        self._build_hot_rows()
        distributed = self.env.distributed and self.exchanges
        self.padding_variables = []
        if distributed and not any(self.entries):
            # A rank sending no column still takes part in the alltoall and in its backward. Its
            # padding must depend on a variable the trainer differentiates, or TensorFlow prunes
            # this rank's backward alltoall and the other ranks wait for it forever.
            padding = self.add_weight(name="exchange_padding", shape=(1, 1), dtype="float32", initializer="zeros", trainable=False)
            self.padding_variables.append(set_layout(mark(padding, VariableKind.PADDING), self._layout([])))
        self.id_sink = None
        if distributed and self.data_parallel_input:
            # Ids this rank receives but does not read (e.g. it owns no feature of one kind):
            # Grappler would prune an alltoall whose result nobody reads, and the other ranks
            # would wait forever: their sum is stored here.
            self.id_sink = self.add_weight(name="id_sink", shape=(), dtype="int64", initializer="zeros", trainable=False)

    # The kernel paths chosen at build are taken only while the kernels are on where the call is traced:
    # inside tf_dlrm.ops.kernels_off (an export's serving graph, XLA's trace) the same layer traces
    # TensorFlow's own ops, with the same values.

    @property
    def group_kernel(self) -> list[bool]:
        return [kernel and bag_kernel() is not None for kernel in self._group_kernel]

    @property
    def replicated_kernel(self) -> list[bool]:
        return [kernel and bag_kernel() is not None for kernel in self._replicated_kernel]

    @property
    def kernel_checked_features(self) -> frozenset:
        return self._kernel_checked_features if bag_kernel() is not None else frozenset()

    @property
    def single_op(self) -> bool:
        return self._single_op and bag_kernel() is not None

    @property
    def sparse_variables(self) -> list:
        return list(self.shard_variables)

    @property
    def dense_variables(self) -> list:
        return list(self.replicated_variables)

    # ------------------------------------------------------------------ forward

    def _normalized(self, features, categorical) -> dict:
        # Ids the kernel pools are checked by it, on the rank that looks them up (one pass fewer).
        return {f: normalize_ids(ids, self.features[f], self.cardinalities[self.feature_tables[f]],
                                 self.validate_ids and f not in self.kernel_checked_features and f not in self.checked_on_input)
                for f, ids in zip(features, categorical)}

    def _kernel_checks(self, entries) -> list[tuple]:
        """(name, table rows, hotness to check or 0) of each entry, for the kernel's own id checks."""
        checks = []
        for f, _ in entries:
            feature = self.features[f]
            hotness = feature.hotness if self.validate_ids and feature.ragged else 0  # fixed: checked by shape
            checks.append((feature.name, self.cardinalities[self.feature_tables[f]], hotness))
        return checks

    @property
    def input_modes(self) -> dict[str, str]:
        """``{feature name: "global" or "local"}``: the ids this rank must be given in :meth:`call`, each for
        the global batch (the model-parallel loader: a rank reads the global batch of the features whose
        tables it owns, with ``data_parallel_input=False``) or for its local batch."""
        user = {f: j for j, positions in enumerate(self.feature_positions) for f in positions} if not self.dynamic_only else {}
        name = (lambda f: self.static_features[user[f]].name) if user else (lambda f: self.features[f].name)
        modes = {name(f): "global" for f in self.global_categorical}
        modes.update({name(f): "local" for f in self.local_categorical})
        if not self.dynamic_only:
            modes.update({f.name: "local" for f in getattr(self, "dynamic_features", ())})
        return modes

    def call(self, inputs, weights=None, local_batch=None, training=None, stacked=False):
        """``inputs``: ``{feature name: ids}`` of the features in :attr:`input_modes` (others are ignored);
        ``weights``: ``{feature name: weights}`` of the weighted ones among them (the ids' shape; keras-rs's
        form: the same structure as ``inputs``). ``local_batch`` (the local batch size) is needed only by a
        rank that reads no local ids.

        Returns ``{feature name: [b, width]}`` (a sequence feature: ``[b, hotness, width]``); with ``stacked``,
        one tensor in feature order instead, a sequence feature counting as ``hotness`` features:
        ``[b, F, D]`` when every feature has width ``D``, else ``[b, sum of widths]``."""
        if not isinstance(inputs, Mapping):
            raise TypeError(f"Expected a dict of ids by feature name ({list(self.input_modes)}). "
                            f"Received: {type(inputs).__name__}")
        training = self.training_default if training is None else training
        missing = [name for name in self.input_modes if name not in inputs]
        if missing:
            raise ValueError(f"Expected ids of every feature {list(self.input_modes)}. Missing: {missing}")
        weights = dict(weights or {})
        unweighted = sorted(set(weights) - {f.name for f in self.output_features if f.weighted})
        if unweighted:
            raise ValueError(f"Expected weights of weighted features only. Received: weights of {unweighted}, which are "
                             "not FeatureConfig(weighted=True) features of this layer")
        if self.dynamic_only:
            vectors = self.dynamic_layer({f.table_name: inputs[f.name] for f in self.features}, training=bool(training))
            return vectors if stacked else {f.name: vectors[:, i] for i, f in enumerate(self.features)}
        categorical, weight_values = self._internal_inputs(inputs, weights)
        pooled = self._lookup(categorical, local_batch, weight_values)
        if self.dynamic_layer is None:
            return pooled if stacked else self.split_features(pooled)
        pieces = self.split_features(pooled)
        vectors = self.dynamic_layer({f.table_name: inputs[f.name] for f in self.dynamic_features},
                                     training=bool(training))
        for index, feature in enumerate(self.dynamic_features):
            pieces[feature.name] = vectors[:, index]
        if not stacked:
            return {f.name: pieces[f.name] for f in self.output_features}
        # A sequence feature's [b, H, w] joins as its H positions, flat.
        flat = [tf.reshape(tf.cast(pieces[f.name], self.compute_dtype), [-1, int(np.prod(pieces[f.name].shape[1:]))])
                for f in self.output_features]
        joined = tf.concat(flat, axis=1)
        return joined if self.output_dim is None else tf.reshape(joined, [-1, len(self.output_widths), self.output_dim])

    def _internal_inputs(self, inputs, weights) -> tuple[list, dict]:
        """The ids of :meth:`_input_features` in that order, and ``{internal feature: weights}`` (float32 values
        aligned with the ids' values) of the weighted ones: a sequence feature cut into its positions."""
        ids, values = {}, {}
        wanted = set(self._input_features())
        for j, feature in enumerate(self.static_features):
            positions = self.feature_positions[j]
            if positions[0] not in wanted:
                continue
            given = inputs[feature.name]
            if not (feature.weighted or feature.sequence):
                ids[positions[0]] = given
                continue
            table_rows = self.cardinalities[self.feature_tables[positions[0]]]
            ragged = normalize_ids(given, feature, table_rows, self.validate_ids)
            if feature.weighted:
                values[positions[0]] = normalize_weights(weights.get(feature.name), ragged, feature)
            if not feature.sequence:
                ids[positions[0]] = ragged
                continue
            for f, (at, at_weights) in zip(positions, split_positions(ragged, values.pop(positions[0], None), feature.hotness)):
                ids[f] = at
                if at_weights is not None:
                    values[f] = at_weights
        return [ids[f] for f in self._input_features()], values

    def _lookup(self, categorical, local_batch=None, weights=None):
        """The ids of :meth:`_input_features`, in that order (and ``{feature: weights}`` of the weighted ones,
        see :meth:`_internal_inputs`) -> the stacked output of :meth:`call`."""
        categorical = list(categorical)
        if local_batch is None:
            local_batch = self._local_batch_from(categorical)
        ids = self._normalized(self._input_features(), categorical)
        weights = dict(weights or {})
        if self.single_op:
            return self._single_op_lookup(ids)
        if self.data_parallel_input and self.exchanges:
            global_ids, global_weights, unread = exchange_ids(self.env, ids, self.features_on_rank, self.env.rank,
                                                              f"{self.name}_id_exchange", weights)
            if unread and self.id_sink is not None:
                self.id_sink.assign(tf.add_n([tf.reduce_sum(tf.cast(u, tf.int64)) for u in unread]))
        else:
            global_ids, global_weights = ids, weights
        # Row bands are added up after the permutation: the assembly kernel only moves columns.
        assemble = self.use_kernel and assemble_kernel() is not None and not self.band_permutations
        parts, part_chunks = [], []
        if self.exchanges:
            block = self._model_parallel_lookup(global_ids, local_batch, flat_received=assemble, weights=global_weights)
            parts.append(block)
            # Flat: one [b, W_s] chunk per source; else [b, sum_s W_s] (one process: W_0).
            part_chunks.append(list(self.send_widths) if block.shape.rank == 1 else [sum(self.send_widths)])
        for variable, offsets, entries, kernel in zip(self.replicated_variables, self.replicated_offsets,
                                                      self.replicated_entries, self.replicated_kernel):
            looked_up = pooled_lookup(variable, [(ids[f], offsets[p], self.features[f].combiner, weights.get(f)) for f, p in entries],
                                      tf.as_dtype(offsets.dtype), kernel=kernel, checks=self._kernel_checks(entries))
            parts.append(tf.cast(looked_up, self.compute_dtype))
            part_chunks.append([int(variable.shape[1]) * len(entries)])
        trivial = len(parts) == 1 and parts[0].shape.rank == 2 and np.array_equal(self.permutation, np.arange(part_chunks[0][0]))
        # A replicated group that no feature reads contributes no column (the kernel wants columns).
        if assemble and not trivial and all(sum(chunks) > 0 for chunks in part_chunks):
            # One copy of the rows (and one for the gradient) instead of concat + permutation.
            pooled = assemble_columns(parts, assembly_layout(part_chunks, self.permutation))
        else:
            joined = tf.concat(parts, axis=1) if len(parts) > 1 else parts[0]
            pooled = permute(joined, self.permutation, axis=1)
            if self.band_permutations:
                # Each further row band's partial vectors, added; a zero column stands in for tables with fewer bands.
                padded = tf.concat([joined, tf.zeros_like(joined[:, :1])], axis=1)
                for permutation in self.band_permutations:
                    pooled = pooled + tf.gather(padded, permutation, axis=1)
        if self.embedding_dim is None:
            return pooled
        return tf.reshape(pooled, [-1, self.num_features, self.embedding_dim])

    def _single_op_lookup(self, ids) -> tf.Tensor:
        """One process: every feature pooled by one kernel op, straight into feature order."""
        columns = np.concatenate([[0], np.cumsum(self.feature_widths)[:-1]])
        variables = self.shard_variables + self.replicated_variables
        placed, features = [], []
        for index, (offsets, entries) in enumerate(zip(self.group_offsets + self.replicated_offsets,
                                                       self.entries + self.replicated_entries)):
            for f, p in entries:
                placed.append((ids[f], offsets[p], self.features[f].combiner, index, int(columns[f])))
                features.append((f, p))
        # One index dtype for the op: int64 when any variable needs it.
        dtypes = {tf.as_dtype(o.dtype) for o in self.group_offsets + self.replicated_offsets}
        index_dtype = tf.int64 if tf.int64 in dtypes else tf.int32
        pooled = multi_table_bag_lookup(variables, placed, index_dtype, self._kernel_checks(features))
        pooled = tf.cast(pooled, self.compute_dtype)
        if self.embedding_dim is None:
            return pooled
        return tf.reshape(pooled, [-1, self.num_features, self.embedding_dim])

    def _input_features(self) -> list[int]:
        """The feature of each tensor passed to :meth:`call`, in order."""
        return list(self.global_categorical) + list(self.local_categorical)

    def split_features(self, pooled) -> dict:
        """The output of :meth:`call` as ``{feature name: [b, width]}`` (a sequence feature ``[b, hotness, width]``)."""
        flat = tf.reshape(pooled, [-1, sum(self.feature_widths)])
        pieces = tf.split(flat, list(self.feature_widths), axis=1)
        result = {}
        for feature, positions in zip(self.static_features, self.feature_positions):
            if feature.sequence:
                result[feature.name] = tf.stack([pieces[f] for f in positions], axis=1)
            else:
                result[feature.name] = pieces[positions[0]]
        return result

    def _local_batch_from(self, categorical):
        if self.data_parallel_input or len(categorical) > len(self.global_categorical):
            ids = categorical[-1]
        elif categorical:
            ids = categorical[0]
        else:
            raise ValueError("This rank reads no ids: pass local_batch to DistributedEmbedding.call")
        rows = ids.nrows(out_type=tf.int32) if isinstance(ids, tf.RaggedTensor) else tf.shape(ids)[0]
        if self.data_parallel_input or len(categorical) > len(self.global_categorical):
            return rows
        return rows // self.plan.world_size

    def _entry_blocks(self, packed):
        """``(rows [N * b, w], feature, position, slice, offsets)`` of every owned entry, packing order,
        cut from ``packed`` (one looked-up block per group with entries)."""
        blocks = iter(packed)
        for (width, slices), offsets, entries in zip(self.groups, self.group_offsets, self.entries):
            block = next(blocks) if entries else None
            for e, (f, p) in enumerate(entries):
                yield block[:, e * width:(e + 1) * width], f, p, slices[p], offsets

    def _model_parallel_lookup(self, global_ids: Mapping[int, tf.Tensor], local_batch, flat_received: bool = False,
                               weights=None):
        """The owned tables' pooled lookups of this rank's samples, ``[b, sum_s W_s]``; with
        ``flat_received``, after the plain exchange, what arrived as it is: flat, source by source
        (``weights``: ``{feature: weights}`` of the weighted features among ``global_ids``)."""
        packed = []
        weights = weights or {}
        # The plain exchange carries the compute dtype: the rows may leave the tables in it.
        plain = not (self.env.distributed and (self.hot_tables or self.deduplicate_exchange))
        for (_, slices), variable, offsets, entries, kernel in zip(self.groups, self.shard_variables, self.group_offsets,
                                                                   self.entries, self.group_kernel):
            if entries:
                packed.append(self._shard_lookup(
                    variable, [self._entry(f, slices[p], global_ids[f], weights.get(f), offsets[p]) for f, p in entries],
                    tf.as_dtype(offsets.dtype), kernel, self._kernel_checks(entries),
                    dtype=tf.as_dtype(self.compute_dtype) if plain else tf.float32))
        if self.hot_tables and self.env.distributed:
            return tf.cast(self._hot_row_lookup(packed, global_ids, local_batch), self.compute_dtype)
        if self.deduplicate_exchange and self.env.distributed:
            mine = [(rows, tf.cast(global_ids[f], tf.as_dtype(offsets.dtype)) + offsets[p], piece.width)
                    for rows, f, p, piece, offsets in self._entry_blocks(packed)]
            received = deduplicated_exchange(self.env, local_batch, mine, self.source_entry_widths, f"{self.name}_dedup")
            return tf.cast(received, self.compute_dtype)
        # Cast before the exchange: under mixed precision the alltoall carries half the bytes.
        local_block = tf.concat([tf.cast(p, self.compute_dtype) for p in packed], axis=1) if packed else None
        if not self.env.distributed:
            return local_block
        if local_block is None:
            padding = tf.cast(self.padding_variables[0], self.compute_dtype)
            local_block = tf.tile(padding, [local_batch * self.plan.world_size, 1])
        received = exchange_block(self.env, local_block, local_batch, self.send_widths, f"{self.name}_exchange")
        if flat_received:
            return received
        # Every source s sends this rank b rows of its width; b is the same for all sources.
        chunks = tf.split(received, [local_batch * w for w in self.send_widths], num=len(self.send_widths))
        return tf.concat([tf.reshape(c, [local_batch, w]) for c, w in zip(chunks, self.send_widths)], axis=1)

    def _entry(self, feature: int, piece, ids, weights, offset) -> tuple:
        """``(ids, row offset, combiner, weights)`` of one feature on one owned slice: of a row band, the
        ids inside it as a ``sum`` (:func:`tf_dlrm.embedding.pooling.band_entry`)."""
        combiner = self.features[feature].combiner
        if piece.table not in self.row_sliced:
            return ids, offset, combiner, weights
        kept, kept_weights = band_entry(ids, weights, combiner, *self.plan.row_range(piece))
        return kept, offset, "sum", kept_weights

    def _shard_lookup(self, variable, entries, index_dtype, kernel, checks, dtype=tf.float32) -> tf.Tensor:
        # One owned variable's pooled lookup; the split-table tests' float32 reference truncates here.
        return pooled_lookup(variable, entries, index_dtype, kernel=kernel, checks=checks, dtype=dtype)

    def compute_output_shape(self, input_shape):
        if isinstance(input_shape, Mapping):
            width = lambda f: f.table.embedding_dim if hasattr(f.table, "embedding_dim") else None  # noqa: E731
            return {f.name: (None, f.hotness, width(f)) if f.sequence else (None, width(f)) for f in self.output_features}
        # Stacked: a sequence feature counts as its positions (output_widths has one width per position).
        if self.output_dim is None:
            return (None, sum(self.output_widths))
        return (None, len(self.output_widths), self.output_dim)

    def get_config(self):
        # Never the rank or the world size: a saved layer is rebuilt for the run that loads it.
        config = {
            **super().get_config(),
            "feature_configs": [feature.to_dict() for feature in self.output_features],
            "seed": self.seed,
            "data_parallel_input": self.data_parallel_input,
            "validate_ids": self.validate_ids,
            "deduplicate_exchange": self.deduplicate_exchange,
            "use_kernel": self.use_kernel,
            "strategy": self.strategy,
            "data_parallel_threshold": self.data_parallel_threshold,
            "column_slice_threshold": self.column_slice_threshold,
            "row_slice_threshold": self.row_slice_threshold,
        }
        return config
