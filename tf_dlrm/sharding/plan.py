"""Sharding plans: which rank holds which rows and columns of which embedding table.

Pure Python on purpose (no TensorFlow, Horovod or numpy): a plan is computed, printed,
serialised and tested without starting a framework; the distributed embedding layer only
executes it. Small tables are replicated on every rank (data-parallel); the others are
model-parallel, held whole (table-wise), cut into contiguous column slices (column-wise), into
contiguous row bands (row-wise), or both (each row band cut into column slices: a grid).
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
class TableSlice:
    """Columns `[column_start, column_end)` of rows `[row_start, row_end)` of table number `table`.

    `row_end=None` means every row from `row_start` on; a `ShardingPlan` writes a band that ends at
    the table's last row that way, so that equal slices compare equal (`ShardingPlan.row_range`
    gives the numbers).
    """
    table: int
    column_start: int
    column_end: int
    row_start: int = 0
    row_end: int | None = None

    def __post_init__(self):
        _check_int("table", self.table, 0)
        _check_int("column_start", self.column_start, 0, f" in a slice of table {self.table}")
        _check_int("column_end", self.column_end, self.column_start + 1,
                   f" (column_start + 1) in a slice of table {self.table}")
        _check_int("row_start", self.row_start, 0, f" in a slice of table {self.table}")
        if self.row_end is not None:
            _check_int("row_end", self.row_end, self.row_start + 1, f" (row_start + 1) in a slice of table {self.table}")

    @property
    def width(self) -> int:
        """Number of columns in the slice."""
        return self.column_end - self.column_start

    def rows_in(self, table_rows: int) -> tuple[int, int]:
        """`(row_start, row_end)` of the slice in a table of `table_rows` rows."""
        return self.row_start, table_rows if self.row_end is None else self.row_end

    def canonical(self, table_rows: int) -> TableSlice:
        """The slice with `row_end=None` when it ends at the table's last row."""
        return dataclasses.replace(self, row_end=None) if self.row_end == table_rows else self

    def label(self, table_rows: int) -> str:
        """`t3[0:64]`, or `t3[0:64] rows [0:5000)` for a row band."""
        start, end = self.rows_in(table_rows)
        rows = "" if (start, end) == (0, table_rows) else f" rows [{start}:{end})"
        return f"t{self.table}[{self.column_start}:{self.column_end}]{rows}"


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
        rank_slices: Per rank, its model-parallel slices sorted by table, at most one slice per
            table. This order is the alltoall packing order.
        bytes_per_element: Bytes of one stored table value.

    A model-parallel table's slices tile it: its row bands (the distinct `[row_start, row_end)` of
    its slices) cover every row once, and within each band the column ranges cover every column
    once. A table with one band is whole or column-sliced; with several, row-sliced.

    Raises:
        ValueError: If some row or column of a model-parallel table is owned by no rank or by more
            than one, a replicated table has slices, or `len(rank_slices) != world_size`.
    """
    world_size: int
    tables: tuple[TableSpec, ...]
    strategy: str
    replicated: tuple[int, ...]
    rank_slices: tuple[tuple[TableSlice, ...], ...]
    bytes_per_element: int = 4

    def __post_init__(self):
        _check_int("world_size", self.world_size, 1)
        _check_int("bytes_per_element", self.bytes_per_element, 1)
        # Accept lists (hand-written plans); store tuples so the plan stays hashable and equal.
        object.__setattr__(self, "tables", tuple(self.tables))
        object.__setattr__(self, "replicated", tuple(self.replicated))
        object.__setattr__(self, "strategy", _parse_strategy(self.strategy).value)
        _check_tables(self.tables)
        count = len(self.tables)
        object.__setattr__(self, "rank_slices", tuple(
            tuple(p.canonical(self.tables[p.table].rows) if isinstance(p, TableSlice) and p.table < count else p for p in r)
            for r in self.rank_slices))
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
                raise ValueError(f"Expected the TableSlices of rank {rank} sorted by table, at "
                                 f"most one per table. Received: {slices}")
            for piece in slices:
                if piece.table not in owners:
                    name = self.tables[piece.table].name if piece.table < count else "(none)"
                    raise ValueError(f"Expected slices of model-parallel tables only. Received: "
                                     f"{piece} on rank {rank}; table {piece.table} {name!r} is "
                                     f"replicated or not in [0, {count})")
                owners[piece.table].append((*piece.rows_in(self.tables[piece.table].rows), piece.column_start,
                                            piece.column_end, rank))
        for table, spans in owners.items():
            self._check_rows(table, spans)

    def _check_rows(self, table: int, spans: list) -> None:
        spec, covered = self.tables[table], 0
        bands = sorted({(start, end) for start, end, *_ in spans})
        for start, end in bands:
            where = f"of table {spec.name!r} (id {table}, {spec.rows} rows)"
            if end > spec.rows:
                raise ValueError(f"Rows [{max(start, spec.rows)}:{end}) {where} do not exist")
            if start > covered:
                raise ValueError(f"Rows [{covered}:{start}) {where} are owned by no rank")
            if start < covered:
                raise ValueError(f"Rows [{start}:{min(end, covered)}) {where} are in two row bands: "
                                 f"the slices of a table must cut its rows into bands")
            self._check_coverage(table, sorted((a, b, rank) for s, e, a, b, rank in spans if (s, e) == (start, end)),
                                 "" if (start, end) == (0, spec.rows) else f" in rows [{start}:{end})")
            covered = end
        if covered < spec.rows:
            raise ValueError(f"Rows [{covered}:{spec.rows}) of table {spec.name!r} (id {table}) are owned by no rank")

    def _check_coverage(self, table: int, spans: list, band: str = "") -> None:
        spec, covered, last_rank = self.tables[table], 0, None
        where = f"of table {spec.name!r} (id {table}, dim {spec.dim}){band}"
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
        sliced = sum(self.slice_rows(p) * p.width for p in self.rank_slices[rank])
        whole = sum(self.tables[t].elements for t in self.replicated)
        return (sliced + whole) * self.bytes_per_element

    def total_bytes(self) -> int:
        """Bytes of all tables held once, as one process would hold them."""
        return sum(spec.elements for spec in self.tables) * self.bytes_per_element

    def imbalance(self) -> float:
        """`max(rank_bytes) / mean(rank_bytes)`: 1.0 is perfectly balanced."""
        loads = [self.rank_bytes(rank) for rank in range(self.world_size)]
        return max(loads) * self.world_size / sum(loads)

    def table_slices(self, table: int) -> tuple[tuple[int, TableSlice], ...]:
        """`(rank, slice)` pairs of a model-parallel table in row-band, then column order (empty if
        replicated)."""
        pairs = [(rank, p) for rank, slices in enumerate(self.rank_slices)
                 for p in slices if p.table == table]
        return tuple(sorted(pairs, key=lambda pair: (pair[1].row_start, pair[1].column_start)))

    def row_range(self, piece: TableSlice) -> tuple[int, int]:
        """`(row_start, row_end)` of a slice of this plan."""
        return piece.rows_in(self.tables[piece.table].rows)

    def slice_rows(self, piece: TableSlice) -> int:
        """Number of rows of a slice of this plan."""
        start, end = self.row_range(piece)
        return end - start

    def row_bands(self, table: int) -> tuple[tuple[int, int], ...]:
        """The `[row_start, row_end)` bands of a model-parallel table, in row order (one: not row-sliced)."""
        return tuple(sorted({self.row_range(p) for _, p in self.table_slices(table)}))

    def column_split(self, table: int) -> bool:
        """Whether some row band of `table` is cut into several column slices (held by several ranks)."""
        bands = [self.row_range(p) for _, p in self.table_slices(table)]
        return len(bands) > len(set(bands))

    @property
    def row_sliced(self) -> tuple[int, ...]:
        """Sorted ids of the tables cut into several row bands."""
        return tuple(t for t in self.model_parallel if len(self.row_bands(t)) > 1)

    def tables_on_rank(self, rank: int) -> tuple[int, ...]:
        """Sorted ids of the model-parallel tables with a slice on `rank`."""
        return tuple(piece.table for piece in self.rank_slices[rank])

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
            "rank_slices": [[_slice_list(p, self.tables[p.table].rows) for p in slices]
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
            rank_slices = [[TableSlice(*_slice_items(item))
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
            pieces = " ".join(p.label(self.tables[p.table].rows) for p in slices)
            lines.append(f"  rank {rank}: {_format_bytes(self.rank_bytes(rank))}, "
                         f"width {self.rank_width(rank)}: {pieces or '(no slices)'}")
        replicated_bytes = sum(self.tables[t].elements for t in self.replicated)
        names = " ".join(f"t{t}" for t in self.replicated) or "(none)"
        lines.append(f"  replicated on every rank "
                     f"({_format_bytes(replicated_bytes * self.bytes_per_element)}): {names}")
        lines.append(f"  imbalance (max/mean rank bytes): {self.imbalance():.3f}")
        return "\n".join(lines)


def _slice_list(piece: TableSlice, table_rows: int) -> list[int]:
    """`[table, column_start, column_end]`, with `row_start, row_end` after them for a row band."""
    columns = [piece.table, piece.column_start, piece.column_end]
    start, end = piece.rows_in(table_rows)
    return columns if (start, end) == (0, table_rows) else columns + [start, end]


def _slice_items(item) -> list:
    if isinstance(item, (list, tuple)) and len(item) == 5:
        return list(item)
    return _as_list(item, "a slice [table, start, end] or [table, start, end, row_start, row_end]", 3)


def _as_list(value, what: str, length: int | None = None) -> list:
    # A str is a Sequence too; only real lists (JSON arrays) and tuples are accepted.
    if not isinstance(value, (list, tuple)) or length not in (None, len(value)):
        raise ValueError(f"expected {what} to be a list, got {value!r}")
    return list(value)

