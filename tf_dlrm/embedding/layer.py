"""ShardedEmbedding: the public Keras layer of the library, ``{feature: ids} -> {feature: pooled}``.

Every rank passes the **local** batch of every feature and gets the local batch of every pooled
embedding back: ids travel to the ranks owning their tables (an alltoall of ids), are looked up and
pooled there, and the pooled vectors come back (one alltoall), so the layer drops into any Keras
model whose other layers are data-parallel. With one rank it is an ordinary embedding layer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import keras

from tf_dlrm.embedding.distributed_embedding import DistributedEmbedding
from tf_dlrm.parallel.env import DistributedEnv
from tf_dlrm.embedding.config import TableConfig, as_feature_config
from tf_dlrm.embedding.planning import plan_tables


@keras.saving.register_keras_serializable(package="tf_dlrm")
class ShardedEmbedding(keras.layers.Layer):
    """Embedding tables sharded over ranks, read by features, pooled per sample.

    Args:
        tables: :class:`TableConfig` (or dicts), one per table.
        features: :class:`FeatureConfig` (or dicts): the keys of the input and output dicts.
        rank, world_size: this process's place (see :func:`tf_dlrm.parallel.env.initialize`).
        strategy: ``auto``, ``table_wise`` or ``column_wise``.
        data_parallel_threshold: tables with fewer rows are replicated on every rank.
        column_slice_threshold: tables with more elements are cut into column slices.
        seed: initial table values depend only on ``(seed, table index)``.
        init_bound: initial values uniform in ``[-init_bound, init_bound]``; None: ``1/sqrt(rows)`` per
            table (the tables' ``uniform_sqrt_rows``; ``main.py``'s ``--embedding_init`` sets 0.05).
    """

    def __init__(self, tables: Sequence, features: Sequence, rank: int = 0, world_size: int = 1,
                 strategy: str = "auto", data_parallel_threshold: int = 0, column_slice_threshold: int | None = None,
                 seed: int = 0, init_bound: float | None = None, **kwargs):
        super().__init__(**kwargs)
        self.tables = tuple(t if isinstance(t, TableConfig) else TableConfig(**dict(t)) for t in tables)
        self.features = tuple(as_feature_config(f) for f in features)
        self.env = DistributedEnv(rank=rank, world_size=world_size)
        self.strategy = strategy
        self.data_parallel_threshold = int(data_parallel_threshold)
        self.column_slice_threshold = column_slice_threshold
        self.seed = int(seed)
        self.plan = plan_tables(self.tables, world_size, strategy=strategy, data_parallel_threshold=data_parallel_threshold,
                                column_slice_threshold=column_slice_threshold, features=self.features)
        # Collective names derive from this layer's name, so several layers in one model never mix.
        self.sharded = DistributedEmbedding(self.plan, rank=rank, seed=seed, data_parallel_input=True, init_bound=init_bound,
                                            features=self.features, name=f"{self.name}_shards")
        self.init_bound = self.sharded.init_bound

    def build(self, input_shape=None):
        self.sharded.build()

    @property
    def sparse_variables(self) -> list:
        """Rank-local shards: their gradients are scaled by 1/N and never averaged."""
        return self.sharded.sparse_variables

    @property
    def dense_variables(self) -> list:
        """Replicated tables: their gradients are averaged over ranks like any dense weight."""
        return self.sharded.dense_variables

    def call(self, inputs: Mapping):
        missing = [f.name for f in self.features if f.name not in inputs]
        if missing:
            raise ValueError(f"Expected ids of every feature {[f.name for f in self.features]}. Missing: {missing}")
        pooled = self.sharded([inputs[f.name] for f in self.features])
        return self.sharded.split_features(pooled)

    def compute_output_shape(self, input_shape):
        widths = {t.name: t.width for t in self.tables}
        return {f.name: (None, widths[f.table]) for f in self.features}

    def get_full_table(self, name: str):
        """Collective: the full table ``name`` on rank 0 (None elsewhere)."""
        return self.sharded.get_full_table([t.name for t in self.tables].index(name))

    def get_config(self):
        return {
            **super().get_config(),
            "tables": [vars(t).copy() for t in self.tables],
            "features": [f.to_dict() for f in self.features],
            "rank": self.env.rank,
            "world_size": self.env.world_size,
            "strategy": self.strategy,
            "data_parallel_threshold": self.data_parallel_threshold,
            "column_slice_threshold": self.column_slice_threshold,
            "seed": self.seed,
            "init_bound": self.init_bound,
        }
