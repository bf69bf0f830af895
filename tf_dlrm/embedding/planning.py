"""From public table configs to a sharding plan: pure Python, no TensorFlow."""

from __future__ import annotations

from collections.abc import Sequence

from tf_dlrm.embedding.config import TableConfig, as_feature_config, feature_tables
from tf_dlrm.sharding.plan import ShardingPlan, TableSpec
from tf_dlrm.sharding.planner import make_plan, table_readers


def plan_tables(tables: Sequence[TableConfig], world_size: int, strategy: str = "auto", data_parallel_threshold: int = 0,
                column_slice_threshold: int | None = None, features: Sequence | None = None) -> ShardingPlan:
    """The plan of ``tables`` (in order) on ``world_size`` ranks; see :func:`make_plan`.

    ``features`` (:class:`FeatureConfig` or dicts): the features reading the tables; a table read by
    several of them costs the planner one exchanged vector per feature. None: one feature per table.
    """
    readers = None
    if features is not None:
        names = [t.name for t in tables]
        readers = table_readers(feature_tables([as_feature_config(f) for f in features], names), len(names))
    return make_plan([TableSpec(t.name, t.rows, t.width) for t in tables], world_size, strategy=strategy,
                     data_parallel_threshold=data_parallel_threshold if world_size > 1 else 0,
                     column_slice_threshold=column_slice_threshold, readers=readers)
