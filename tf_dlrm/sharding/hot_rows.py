"""Hot-row plan: which rows of each model-parallel table are replicated on every rank.

Pure Python (numpy for the counts, no TF). Recommendation ids are skewed, so a few rows carry most
lookups; replicating them on every rank keeps those lookups local and out of the alltoall. Under a
memory budget (a fraction of the model-parallel tables' bytes) rows are chosen across all tables by
lookups saved per byte (count / dim), the greedy optimum for this knapsack when rows are small.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tf_dlrm.sharding.plan import ShardingPlan

MAX_BUDGET = 1.0


@dataclasses.dataclass(frozen=True)
class HotRows:
    """The hot rows of one table: ids sorted ascending, and the share of lookups they take."""
    table: int
    name: str
    ids: tuple[int, ...]
    hit_rate: float

    @property
    def count(self) -> int:
        return len(self.ids)


@dataclasses.dataclass(frozen=True)
class HotRowPlan:
    """Hot rows per model-parallel table (tables with none are left out) under `budget`."""
    budget: float
    tables: tuple[HotRows, ...]
    hot_bytes: int
    budget_bytes: int
    overall_hit_rate: float

    def for_table(self, table: int) -> tuple[int, ...]:
        for hot in self.tables:
            if hot.table == table:
                return hot.ids
        return ()

    def describe(self) -> str:
        lines = [f"hot rows: budget {self.budget:g} of model-parallel table memory = {self.budget_bytes} bytes, "
                 f"used {self.hot_bytes} bytes; expected hit rate {self.overall_hit_rate:.4f}"]
        for hot in self.tables:
            lines.append(f"  table {hot.table} ({hot.name}): {hot.count} hot rows, expected hit rate {hot.hit_rate:.4f}")
        return "\n".join(lines)


def min_count_for(world_size: int, samples: int, global_batch_size: int) -> int:
    """Occurrences (in counts over ``samples``) of a row looked up ``world_size`` times per global batch.

    Exact replication sends every touched hot row to every rank each step (about ``2 N D`` bytes over
    all ranks per distinct hot id) where the alltoall sent ``2 D`` per lookup: a row pays for its
    replica when a batch looks it up more than about N times (``benchmarks/scaling_hot_rows.py``).
    """
    if world_size < 1 or samples < 1 or global_batch_size < 1:
        raise ValueError(f"Expected world_size, samples and global_batch_size >= 1. Received: {world_size}, "
                         f"{samples}, {global_batch_size}")
    return -(-world_size * samples // global_batch_size)


def plan_hot_rows(plan: ShardingPlan, counts: list, budget: float, bytes_per_value: int = 4,
                  min_count: int = 1) -> HotRowPlan:
    """Chooses hot rows of `plan`'s model-parallel tables.

    Args:
        plan: the sharding plan; only its model-parallel tables get hot rows (replicated ones are local).
        counts: per table (same order as ``plan.tables``), the occurrence count of every id.
        budget: fraction of the model-parallel tables' bytes the replicas may use, in ``[0, 1]``.
        min_count: rows counted fewer times stay cold even when the budget has room
            (:func:`min_count_for` gives the count at which replication saves bytes).
    """
    if not isinstance(budget, (int, float)) or not 0 <= budget <= MAX_BUDGET:
        raise ValueError(f"Expected 0 <= hot_rows_budget <= {MAX_BUDGET}. Received: hot_rows_budget={budget!r}")
    if not isinstance(min_count, (int, np.integer)) or isinstance(min_count, bool) or min_count < 1:
        raise ValueError(f"Expected an integer min_count >= 1. Received: min_count={min_count!r}")
    if len(counts) != len(plan.tables):
        raise ValueError(f"Expected id counts for {len(plan.tables)} tables. Received: {len(counts)}")
    tables = plan.model_parallel
    arrays = {}
    for table in tables:
        spec = plan.tables[table]
        array = np.asarray(counts[table], dtype=np.int64)
        if array.shape != (spec.rows,):
            raise ValueError(f"Id counts of table {table} ({spec.name!r}) have shape {array.shape}, "
                             f"expected ({spec.rows},)")
        if (array < 0).any():
            raise ValueError(f"Id counts of table {table} ({spec.name!r}) are negative")
        arrays[table] = array
    total_bytes = sum(plan.tables[t].elements for t in tables) * bytes_per_value
    budget_bytes = int(budget * total_bytes)
    # Candidates: (lookups per byte, table, id), only ids that occur; best first, ties by table then id.
    candidates = []
    for table, array in arrays.items():
        ids = np.flatnonzero(array >= min_count)
        row_bytes = plan.tables[table].dim * bytes_per_value
        candidates.append((array[ids] / row_bytes, np.full(ids.size, table), ids, np.full(ids.size, row_bytes)))
    chosen = {table: [] for table in tables}
    used = 0
    if candidates and budget_bytes > 0:
        density = np.concatenate([c[0] for c in candidates])
        owner = np.concatenate([c[1] for c in candidates])
        ids = np.concatenate([c[2] for c in candidates])
        sizes = np.concatenate([c[3] for c in candidates])
        order = np.lexsort((ids, owner, -density))
        cumulative = np.cumsum(sizes[order])
        take = order[cumulative <= budget_bytes]
        used = int(sizes[take].sum())
        for table in tables:
            chosen[table] = np.sort(ids[take][owner[take] == table])
    result, hits, lookups = [], 0, 0
    for table in tables:
        array = arrays[table]
        table_hits = int(array[chosen[table]].sum()) if len(chosen[table]) else 0
        hits += table_hits
        lookups += int(array.sum())
        if len(chosen[table]):
            rate = table_hits / max(int(array.sum()), 1)
            result.append(HotRows(table, plan.tables[table].name, tuple(int(i) for i in chosen[table]), rate))
    return HotRowPlan(float(budget), tuple(result), used, budget_bytes, hits / max(lookups, 1))
