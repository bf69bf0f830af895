"""Memory per rank of a sharding plan: tables, their optimizer state and hot-row replicas.

Pure Python (no TensorFlow, Horovod or numpy), like :mod:`tf_dlrm.sharding.plan`: the trainer
refuses a plan that does not fit ``--memory_per_rank`` before it allocates anything, with the
numbers, and prints what each rank will hold.

What a rank holds, in float32 values (4 bytes):

- tables: its slices (``rows of the slice * width``) and every replicated table whole;
- optimizer state: per-element slots (Adagrad 1, lazy Adam 2, FTRL 2) shaped like each of those,
  row-wise slots (row-wise Adagrad) one value per row of each slice it holds;
- hot-row replicas: whole rows (``D`` values) of every hot row of every table, plus their state
  (twice with ``--hot_row_sync_every`` > 1: the values agreed at the last merge are kept beside them).

- the dense model (every rank holds it whole) and its optimizer state: known once the model is built,
  added then by :func:`with_dense` and checked again (a model with large MLPs and little in its tables
  must not pass a budget its dense part alone exceeds).

Not counted: TensorFlow's own memory, and transient buffers of a step (looked-up rows, gradients, the
exchange).
"""

from __future__ import annotations

import dataclasses
import re

from tf_dlrm.sharding.plan import ShardingPlan, _format_bytes

BYTES = 4
LARGEST = 3  # tables named per rank when a plan does not fit
_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
          "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}


def parse_bytes(text, flag: str = "--memory_per_rank") -> int:
    """``"1.5GiB"``, ``"800MB"``, ``"1000000"`` -> bytes; 0 or empty means no limit."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text or "0"))
        if not match or match.group(2).lower() not in _UNITS:
            raise ValueError(f"Expected {flag} as a size such as 2GiB, 1500MiB, 800MB or a number of bytes. Received: {flag}={text!r}")
        value, unit = float(match.group(1)), match.group(2).lower()
    if value < 0:
        raise ValueError(f"Expected {flag} >= 0. Received: {flag}={text!r}")
    return int(value * _UNITS[unit])


@dataclasses.dataclass(frozen=True)
class RankMemory:
    """Bytes one rank holds (see the module docstring)."""
    rank: int
    tables: int
    optimizer_state: int
    hot_rows: int
    largest: tuple[tuple[str, int], ...] = ()  # (table, bytes with its state) of its largest tables, largest first
    dense: int = 0  # the dense weights (0 until the model is built: with_dense)
    dense_optimizer_state: int = 0

    @property
    def total(self) -> int:
        return self.tables + self.optimizer_state + self.hot_rows + self.dense + self.dense_optimizer_state

    def describe(self) -> str:
        dense = (f", dense weights {_format_bytes(self.dense)} and their optimizer state "
                 f"{_format_bytes(self.dense_optimizer_state)}") if self.dense or self.dense_optimizer_state else ""
        return (f"rank {self.rank}: {_format_bytes(self.total)} (tables {_format_bytes(self.tables)}, optimizer state "
                f"{_format_bytes(self.optimizer_state)}, hot rows {_format_bytes(self.hot_rows)}{dense})")


def with_dense(memory: list[RankMemory], dense: int, dense_optimizer_state: int) -> list[RankMemory]:
    """``memory`` with the dense weights' and their optimizer state's bytes, the same on every rank."""
    return [dataclasses.replace(m, dense=dense, dense_optimizer_state=dense_optimizer_state) for m in memory]


def plan_memory(plan: ShardingPlan, element_slots: int = 0, row_slots: int = 0, hot_rows=None,
                hot_copies: int = 1) -> list[RankMemory]:
    """Every rank's :class:`RankMemory`.

    Args:
        plan: the sharding plan.
        element_slots: optimizer state values per table value (0 for SGD).
        row_slots: row-wise state values per row of every slice (1 for row-wise Adagrad).
        hot_rows: ``{table: count}`` of hot rows replicated on every rank.
        hot_copies: copies of the replicas and their state each rank keeps (2 under bounded staleness).
    """
    hot_rows = dict(hot_rows or {})
    replicated_values = sum(plan.tables[t].elements for t in plan.replicated)
    replicated_rows = sum(plan.tables[t].rows for t in plan.replicated)
    hot_values = sum(count * plan.tables[t].dim for t, count in hot_rows.items())
    hot_row_count = sum(hot_rows.values())
    found = []
    for rank, slices in enumerate(plan.rank_slices):
        values = sum(plan.slice_rows(s) * s.width for s in slices) + replicated_values
        rows = sum(plan.slice_rows(s) for s in slices) + replicated_rows
        per_table = {}
        for table, width, table_rows in [(s.table, s.width, plan.slice_rows(s)) for s in slices] + \
                [(t, plan.tables[t].dim, plan.tables[t].rows) for t in plan.replicated]:
            held = (table_rows * width * (1 + element_slots) + table_rows * row_slots) * BYTES
            per_table[plan.tables[table].name] = per_table.get(plan.tables[table].name, 0) + held
        largest = tuple(sorted(per_table.items(), key=lambda item: (-item[1], item[0]))[:LARGEST])
        found.append(RankMemory(
            rank=rank, tables=values * BYTES,
            optimizer_state=(values * element_slots + rows * row_slots) * BYTES,
            hot_rows=(hot_values * (1 + element_slots) + hot_row_count * row_slots) * BYTES * hot_copies,
            largest=largest))
    return found


def check_budget(memory: list[RankMemory], budget: int, flag: str = "--memory_per_rank") -> None:
    """Raises ValueError naming the flag and every rank over ``budget`` bytes (0: no budget)."""
    if not budget:
        return
    over = [m for m in memory if m.total > budget]
    if not over:
        return
    dense = max(m.dense + m.dense_optimizer_state for m in over)
    if dense > budget:  # whatever the plan: every rank holds the dense part whole
        raise ValueError(f"{flag}={_format_bytes(budget)}: the model does not fit: "
                         + "; ".join(m.describe() for m in over) + ". " + DENSE_REMEDIES)
    raise ValueError(f"{flag}={_format_bytes(budget)}: the sharding plan does not fit: "
                     + "; ".join(m.describe() for m in over) + ". " + _largest(over) + REMEDIES)


REMEDIES = ("Use more ranks, --dist_strategy=column_wise (spreads a large table over ranks), a smaller --hot_rows_budget, "
            "or an embedding optimizer with less state (sgd: none, rowwise_adagrad: one value per row)")


DENSE_REMEDIES = ("Its dense weights and their optimizer state alone take more, on every rank whatever the plan: use "
                  "smaller MLPs, or a dense --optimizer with less state (sgd: none, adagrad: one value per weight)")


def _largest(over: list[RankMemory]) -> str:
    worst = max(over, key=lambda m: m.total)
    if not worst.largest:
        return ""
    return (f"Largest tables on rank {worst.rank} (with their optimizer state): "
            + ", ".join(f"{name!r} {_format_bytes(size)}" for name, size in worst.largest) + ". ")


def check_limits(memory: list[RankMemory], limits) -> None:
    """Raises ValueError when the ranks sharing a limit (``(ranks, limit)`` pairs: a host's available
    RAM, a memory cgroup's headroom; :func:`tf_dlrm.parallel.host_memory.groups`) plan more bytes than it
    has: names the limit, the ranks' bytes, the largest tables and the remedies."""
    for ranks, limit in limits:
        members = [memory[r] for r in ranks]
        needed = sum(m.total for m in members)
        if needed > limit.available:
            who = f"rank {ranks[0]} needs" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))} need"
            raise ValueError(
                f"the sharding plan does not fit in memory: {who} {_format_bytes(needed)} for embedding tables and "
                f"their optimizer state ({'; '.join(m.describe() for m in members)}), more than the "
                f"{_format_bytes(limit.available)} left by {limit.source}. " + _largest(members) + REMEDIES)
