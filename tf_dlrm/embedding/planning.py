"""From public table configs to a sharding plan: pure Python, no TensorFlow."""

from __future__ import annotations

from collections.abc import Sequence

from tf_dlrm.distributed.plan import ShardingPlan, TableSpec
from tf_dlrm.distributed.planner import make_plan
from tf_dlrm.config.embedding import TableConfig


def plan_tables(tables: Sequence[TableConfig], world_size: int, strategy: str = "auto", data_parallel_threshold: int = 0,
                column_slice_threshold: int | None = None) -> ShardingPlan:
    """The plan of ``tables`` (in order) on ``world_size`` ranks; see :func:`make_plan`."""
    return make_plan([TableSpec(t.name, t.rows, t.width) for t in tables], world_size, strategy=strategy,
                     data_parallel_threshold=data_parallel_threshold if world_size > 1 else 0,
                     column_slice_threshold=column_slice_threshold)
