"""Sharding plans: which rank holds which columns of which embedding table.

Pure Python on purpose (no TensorFlow, Horovod or numpy): a plan is computed, printed,
serialised and tested without starting a framework; the distributed embedding layer only
executes it. Small tables are replicated on every rank (data-parallel); the others are
model-parallel, held whole (table-wise) or cut into contiguous column slices (column-wise).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping


class Strategy(str, enum.Enum):
    """How model-parallel tables are spread over ranks."""
    TABLE_WISE = "table_wise"
    COLUMN_WISE = "column_wise"
    AUTO = "auto"


_PLAN_KEYS = ("world_size", "strategy", "bytes_per_element", "tables", "replicated", "rank_slices")


def _check_int(name: str, value, minimum: int, context: str = "") -> None:
    # bool is an int subclass: `rows=True` would otherwise be accepted silently.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"Expected {name} to be an integer{context}. Received: {name}={value!r}")
    if value < minimum:
        raise ValueError(f"Expected {name} >= {minimum}{context}. Received: {name}={value!r}")


def _parse_strategy(strategy) -> Strategy:
    try:
        return Strategy(strategy)
    except ValueError:
        allowed = ", ".join(repr(s.value) for s in Strategy)
        raise ValueError(f"Expected strategy to be one of {allowed}. "
                         f"Received: strategy={strategy!r}") from None


@dataclasses.dataclass(frozen=True)
class TableSpec:
    """One embedding table: `rows` ids (the cardinality), each a vector of `dim` values."""
    name: str
    rows: int
    dim: int

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Expected a non-empty table name. Received: name={self.name!r}")
        _check_int("rows", self.rows, 1, f" for table {self.name!r}")
        _check_int("dim", self.dim, 1, f" for table {self.name!r}")

    @property
    def elements(self) -> int:
        """Number of stored values, `rows * dim`."""
        return self.rows * self.dim


@dataclasses.dataclass(frozen=True)
class ColumnSlice:
    """Columns `[column_start, column_end)` of table number `table` (all rows)."""
    table: int
    column_start: int
    column_end: int

    def __post_init__(self):
        _check_int("table", self.table, 0)
        _check_int("column_start", self.column_start, 0, f" in a slice of table {self.table}")
        _check_int("column_end", self.column_end, self.column_start + 1,
                   f" (column_start + 1) in a slice of table {self.table}")

    @property
    def width(self) -> int:
        """Number of columns in the slice."""
        return self.column_end - self.column_start


def _check_tables(tables: tuple) -> None:
    if not tables:
        raise ValueError("Expected at least one embedding table. Received: tables=()")
    seen = {}
    for index, spec in enumerate(tables):
        if not isinstance(spec, TableSpec):
            raise ValueError(f"Expected tables[{index}] to be a TableSpec. Received: {spec!r}")
        if spec.name in seen:
            raise ValueError(f"Expected unique table names. Received: {spec.name!r} "
                             f"as tables {seen[spec.name]} and {index}")
        seen[spec.name] = index


def _format_bytes(count: int) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:.2f} {unit}"
    return f"{count} B"


@dataclasses.dataclass(frozen=True)
class ShardingPlan:
    """Where every embedding table lives on `world_size` ranks.

    Attributes:
        world_size: Number of ranks.
        tables: Table specs in feature-spec order; the index is the table id.
        strategy: The `Strategy` value that produced the plan.
        replicated: Sorted ids of tables every rank holds whole (data-parallel).
        rank_slices: Per rank, its model-parallel slices sorted by `(table, column_start)`, at
            most one slice per table. This order is the alltoall packing order.
        bytes_per_element: Bytes of one stored table value.

    Raises:
        ValueError: If some column of a model-parallel table is owned by no rank or by more
            than one, a replicated table has slices, or `len(rank_slices) != world_size`.
    """
    world_size: int
    tables: tuple[TableSpec, ...]
    strategy: str
    replicated: tuple[int, ...]
    rank_slices: tuple[tuple[ColumnSlice, ...], ...]
    bytes_per_element: int = 4

    def __post_init__(self):
        _check_int("world_size", self.world_size, 1)
        _check_int("bytes_per_element", self.bytes_per_element, 1)
        # Accept lists (hand-written plans); store tuples so the plan stays hashable and equal.
        object.__setattr__(self, "tables", tuple(self.tables))
        object.__setattr__(self, "replicated", tuple(self.replicated))
        object.__setattr__(self, "rank_slices", tuple(tuple(r) for r in self.rank_slices))
        object.__setattr__(self, "strategy", _parse_strategy(self.strategy).value)
        _check_tables(self.tables)
        count = len(self.tables)
        for index, table in enumerate(self.replicated):
            _check_int("replicated table id", table, 0)
            if table >= count or (index and table <= self.replicated[index - 1]):
                raise ValueError(f"Expected sorted unique replicated table ids in [0, {count}). "
                                 f"Received: replicated={self.replicated}")
        if len(self.rank_slices) != self.world_size:
            raise ValueError(f"Expected one slice list per rank ({self.world_size}). "
                             f"Received: {len(self.rank_slices)} slice lists")
        owners = {table: [] for table in self.model_parallel}
        for rank, slices in enumerate(self.rank_slices):
            tables = [getattr(piece, "table", None) for piece in slices]
            if None in tables or tables != sorted(set(tables)):
                raise ValueError(f"Expected the ColumnSlices of rank {rank} sorted by table, at "
                                 f"most one per table. Received: {slices}")
            for piece in slices:
                if piece.table not in owners:
                    name = self.tables[piece.table].name if piece.table < count else "(none)"
                    raise ValueError(f"Expected slices of model-parallel tables only. Received: "
                                     f"{piece} on rank {rank}; table {piece.table} {name!r} is "
                                     f"replicated or not in [0, {count})")
                owners[piece.table].append((piece.column_start, piece.column_end, rank))
        for table, spans in owners.items():
            self._check_coverage(table, sorted(spans))

    def _check_coverage(self, table: int, spans: list) -> None:
        spec, covered, last_rank = self.tables[table], 0, None
        where = f"of table {spec.name!r} (id {table}, dim {spec.dim})"
        for start, end, rank in spans:
            if end > spec.dim:
                raise ValueError(f"Columns [{max(start, spec.dim)}:{end}) {where} do not exist "
                                 f"(owned by rank {rank})")
            if start > covered:
                raise ValueError(f"Columns [{covered}:{start}) {where} are owned by no rank")
            if start < covered:
                raise ValueError(f"Columns [{start}:{min(end, covered)}) {where} are owned by "
                                 f"more than one rank (ranks {last_rank} and {rank})")
            covered, last_rank = end, rank
        if covered < spec.dim:
            raise ValueError(f"Columns [{covered}:{spec.dim}) {where} are owned by no rank")

    @property
    def model_parallel(self) -> tuple[int, ...]:
        """Sorted ids of the tables that are not replicated."""
        replicated = set(self.replicated)
        return tuple(t for t in range(len(self.tables)) if t not in replicated)

    def rank_width(self, rank: int) -> int:
        """Sum of the widths of `rank`'s slices: its column count in the alltoall."""
        return sum(piece.width for piece in self.rank_slices[rank])

    def rank_bytes(self, rank: int) -> int:
        """Bytes of table values `rank` holds: its slices plus every replicated table."""
        sliced = sum(self.tables[p.table].rows * p.width for p in self.rank_slices[rank])
        whole = sum(self.tables[t].elements for t in self.replicated)
        return (sliced + whole) * self.bytes_per_element

    def total_bytes(self) -> int:
        """Bytes of all tables held once, as one process would hold them."""
        return sum(spec.elements for spec in self.tables) * self.bytes_per_element

    def imbalance(self) -> float:
        """`max(rank_bytes) / mean(rank_bytes)`: 1.0 is perfectly balanced."""
        loads = [self.rank_bytes(rank) for rank in range(self.world_size)]
        return max(loads) * self.world_size / sum(loads)

    def table_slices(self, table: int) -> tuple[tuple[int, ColumnSlice], ...]:
        """`(rank, slice)` pairs of a model-parallel table in column order (empty if replicated)."""
        pairs = [(rank, p) for rank, slices in enumerate(self.rank_slices)
                 for p in slices if p.table == table]
        return tuple(sorted(pairs, key=lambda pair: pair[1].column_start))

    def tables_on_rank(self, rank: int) -> tuple[int, ...]:
        """Sorted ids of the model-parallel tables with a slice on `rank`."""
        return tuple(piece.table for piece in self.rank_slices[rank])

    def received_column_order(self) -> tuple[int, ...]:
        """Column permutation that turns the alltoall output into table order.

        A receiver gets from each source rank r (in rank order) a `[local_batch, W_r]` block
        holding r's slices in packing order; side by side these form `received` of shape
        `[local_batch, sum_r W_r]`.

        Returns:
            `perm` such that `received[:, perm]` is the model-parallel tables in id order,
            each table's columns `0..dim-1` consecutively.
        """
        position, offset = {}, 0
        for slices in self.rank_slices:
            for piece in slices:
                position[piece.table, piece.column_start] = offset
                offset += piece.width
        perm = []
        for table in self.model_parallel:
            for _, piece in self.table_slices(table):
                start = position[table, piece.column_start]
                perm.extend(range(start, start + piece.width))
        return tuple(perm)

    def alltoall_bytes_per_step(self, global_batch_size: int, bytes_per_value: int = 4) -> int:
        """Bytes the busiest rank sends to other ranks in one forward embedding exchange.

        Rank r sends each of the other `world_size - 1` ranks a `[local_batch, W_r]` block (the
        block it keeps is not counted), so this is `max_r (world_size - 1) * local_batch * W_r *
        bytes_per_value`. The backward exchange moves as much the other way.

        Args:
            global_batch_size: Samples per step over all ranks; a multiple of `world_size`.
            bytes_per_value: Bytes of one exchanged value (2 under mixed precision).
        """
        _check_int("global_batch_size", global_batch_size, 1)
        _check_int("bytes_per_value", bytes_per_value, 1)
        if global_batch_size % self.world_size:
            raise ValueError(f"Expected global_batch_size to be a multiple of world_size="
                             f"{self.world_size}. Received: global_batch_size={global_batch_size}")
        local_batch = global_batch_size // self.world_size
        widest = max(self.rank_width(rank) for rank in range(self.world_size))
        return (self.world_size - 1) * local_batch * widest * bytes_per_value

    def to_dict(self) -> dict:
        """Plain dict (str, int, list) for JSON or YAML; `from_dict` inverts it exactly."""
        return {
            "world_size": self.world_size,
            "strategy": self.strategy,
            "bytes_per_element": self.bytes_per_element,
            "tables": [{"name": s.name, "rows": s.rows, "dim": s.dim} for s in self.tables],
            "replicated": list(self.replicated),
            "rank_slices": [[[p.table, p.column_start, p.column_end] for p in slices]
                            for slices in self.rank_slices],
        }

    @classmethod
    def from_dict(cls, config: Mapping) -> ShardingPlan:
        """Rebuilds a plan written by `to_dict`.

        Raises:
            ValueError: If keys are missing or unknown, a value has the wrong type or the
                plan it describes is invalid.
        """
        if not isinstance(config, Mapping):
            raise ValueError(f"Expected a sharding plan dict. Received: {type(config).__name__}")
        missing = [key for key in _PLAN_KEYS if key not in config]
        unknown = sorted(str(key) for key in config if key not in _PLAN_KEYS)
        if missing or unknown:
            raise ValueError(f"Malformed sharding plan dict: expected keys {list(_PLAN_KEYS)}. "
                             f"Missing: {missing}, unknown: {unknown}")
        try:
            tables = []
            for entry in _as_list(config["tables"], "tables"):
                if not isinstance(entry, Mapping) or set(entry) != {"name", "rows", "dim"}:
                    raise ValueError(f"expected each table as {{name, rows, dim}}, got {entry!r}")
                tables.append(TableSpec(entry["name"], entry["rows"], entry["dim"]))
            rank_slices = [[ColumnSlice(*_as_list(item, "a slice [table, start, end]", 3))
                            for item in _as_list(slices, f"rank_slices[{rank}]")]
                           for rank, slices in enumerate(
                               _as_list(config["rank_slices"], "rank_slices"))]
            return cls(world_size=config["world_size"], tables=tables, strategy=config["strategy"],
                       replicated=_as_list(config["replicated"], "replicated"),
                       rank_slices=rank_slices, bytes_per_element=config["bytes_per_element"])
        except ValueError as error:
            raise ValueError(f"Malformed sharding plan dict: {error}") from error

    def describe(self) -> str:
        """Short multi-line summary: one line per rank, replicated tables, imbalance."""
        lines = [f"ShardingPlan: strategy={self.strategy}, world_size={self.world_size}, "
                 f"{len(self.tables)} tables ({len(self.model_parallel)} model-parallel, "
                 f"{len(self.replicated)} replicated), {_format_bytes(self.total_bytes())} in all"]
        for rank, slices in enumerate(self.rank_slices):
            pieces = " ".join(f"t{p.table}[{p.column_start}:{p.column_end}]" for p in slices)
            lines.append(f"  rank {rank}: {_format_bytes(self.rank_bytes(rank))}, "
                         f"width {self.rank_width(rank)}: {pieces or '(no slices)'}")
        replicated_bytes = sum(self.tables[t].elements for t in self.replicated)
        names = " ".join(f"t{t}" for t in self.replicated) or "(none)"
        lines.append(f"  replicated on every rank "
                     f"({_format_bytes(replicated_bytes * self.bytes_per_element)}): {names}")
        lines.append(f"  imbalance (max/mean rank bytes): {self.imbalance():.3f}")
        return "\n".join(lines)


def _as_list(value, what: str, length: int | None = None) -> list:
    # A str is a Sequence too; only real lists (JSON arrays) and tuples are accepted.
    if not isinstance(value, (list, tuple)) or length not in (None, len(value)):
        raise ValueError(f"expected {what} to be a list, got {value!r}")
    return list(value)

