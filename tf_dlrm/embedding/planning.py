"""From public table configs to a sharding plan: pure Python, no TensorFlow."""

from __future__ import annotations

from collections.abc import Sequence

from tf_dlrm.sharding.plan import ShardingPlan, TableSpec
from tf_dlrm.sharding.planner import make_plan, table_readers
from tf_dlrm.embedding.table_config import FeatureConfig, TableConfig, feature_tables


def plan_tables(tables: Sequence[TableConfig], features: Sequence[FeatureConfig], world_size: int, strategy: str = "auto",
                data_parallel_threshold: int = 0, column_slice_threshold: int | None = None) -> ShardingPlan:
    """The plan of ``tables`` (in order) on ``world_size`` ranks, honouring each table's placement
    (see :func:`make_plan`); a table read by several ``features`` costs the planner one exchanged
    vector per feature."""
    names = [t.name for t in tables]
    readers = table_readers(feature_tables(features, names), len(names))
    return make_plan([TableSpec(t.name, t.vocabulary_size, t.embedding_dim) for t in tables], world_size,
                     strategy=strategy, data_parallel_threshold=data_parallel_threshold if world_size > 1 else 0,
                     column_slice_threshold=column_slice_threshold, readers=readers,
                     placements=[t.placement.sharding for t in tables])
