"""From public table configs to a sharding plan: pure Python, no TensorFlow."""

from __future__ import annotations

from collections.abc import Sequence

from tf_dlrm.sharding.plan import ShardingPlan, TableSpec
from tf_dlrm.sharding.planner import make_plan, table_readers
from tf_dlrm.embedding.table_config import FeatureConfig, TableConfig, feature_tables


# Tables of fewer rows are replicated on every rank (several ranks only): their lookups need no exchange,
# and their dense gradients are small. main.py's --data_parallel_rows defaults to it.
DEFAULT_DATA_PARALLEL_ROWS = 2048


def table_specs(tables: Sequence[TableConfig]) -> list[TableSpec]:
    """The planner's view of ``tables``: name, rows and width."""
    return [TableSpec(t.name, t.vocabulary_size, t.embedding_dim) for t in tables]


def plan_tables(tables: Sequence[TableConfig], features: Sequence[FeatureConfig], world_size: int, strategy: str = "auto",
                data_parallel_threshold: int = DEFAULT_DATA_PARALLEL_ROWS, column_slice_threshold: int | None = None,
                unplanned: Sequence[TableConfig] = (), row_slice_threshold: int | None = None) -> ShardingPlan:
    """The plan of ``tables`` (in order) on ``world_size`` ranks, honouring each table's placement
    (see :func:`make_plan`); a table read by several ``features`` costs the planner one exchanged
    vector per feature. With a row-wise optimizer in the model, a table which several lookups per
    sample read stays whole (:func:`row_wise_kept_whole`); ``unplanned``: the model's tables outside
    the plan (dynamic tables), whose optimizers count too. With a row-wise optimizer in the model a
    ``grid`` placement is refused: row-wise state is exact on row bands and on column slices, not on both."""
    names = [t.name for t in tables]
    readers = table_readers(feature_tables(features, names), len(names))
    row_wise = [t for t in (*tables, *unplanned) if t.optimizer is not None and t.optimizer.make().row_wise]
    source = f"table {row_wise[0].name!r}: {type(row_wise[0].optimizer).__name__}" if row_wise else None
    grids = [t.name for t in tables if t.placement.sharding == "grid"]
    if row_wise and grids:
        raise ValueError(f"Tables {grids} cannot be placed 'grid': the model keeps row-wise optimizer state ({source}), "
                         "exact on row bands or on column slices but not on both. Place them 'row_wise' or 'column_wise', "
                         "or train them with an optimizer keeping state per element (Adagrad instead of RowWiseAdagrad)")
    return make_plan(table_specs(tables), world_size,
                     strategy=strategy, data_parallel_threshold=data_parallel_threshold if world_size > 1 else 0,
                     column_slice_threshold=column_slice_threshold, row_slice_threshold=row_slice_threshold, readers=readers,
                     placements=[t.placement.sharding for t in tables],
                     kept_whole=row_wise_kept_whole(names, features, source))


def row_wise_kept_whole(table_names: Sequence[str], features: Sequence[FeatureConfig], row_wise: str | None) -> list[str | None]:
    """Per table, None, or why its columns must not be cut (``kept_whole`` of :func:`make_plan`).

    A row-wise optimizer (row-wise Adagrad) keeps one value per row, from the squared gradient of
    the whole row; when a model has one, the training step keeps row-wise state for every fused
    variable. Column slices of a table on several ranks make it exact with one small allreduce per
    step of each sample's partial sums of squares, laid out one entry per sample and sliced table:
    exact when one one-hot feature reads each sliced table, not when a sample looks a table up
    several times (multi-hot, or several features). So with a row-wise optimizer anywhere in the
    model (``row_wise``: where, for the message; None: none), such tables stay whole, and the model
    trains the same on every number of ranks."""
    if row_wise is None:
        return [None] * len(table_names)
    index = feature_tables(features, table_names)
    reasons: list[str | None] = []
    for table, name in enumerate(table_names):
        readers = [f for f, t in zip(features, index) if t == table]
        if len(readers) <= 1 and all(f.one_hot for f in readers):
            reasons.append(None)
            continue
        read_by = ", ".join(f"{f.name!r} ({'one-hot' if f.one_hot else 'ragged' if f.ragged else f'hotness {f.hotness}'})"
                            for f in readers)
        reasons.append(f"the model keeps row-wise optimizer state ({row_wise}), exact on column slices only when one one-hot "
                       f"feature reads each sliced table, and {name!r} is read by {read_by}. Give it placement='auto' or "
                       "'table_wise' (it stays whole), or train every table with an optimizer keeping state per element "
                       "(Adagrad instead of RowWiseAdagrad)")
    return reasons
