"""Planning: from table sizes, world size and thresholds to a :class:`ShardingPlan`.

Pure Python like the plan itself. Pieces (whole tables, column slices, row bands or both) are placed
largest first on the least-loaded rank; ``auto`` searches over how finely to slice the largest tables
by columns, then cuts tall tables into row bands while that lowers the fullest rank's memory.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Mapping, Sequence

from tf_dlrm.sharding.plan import (
    TableSlice,
    ShardingPlan,
    Strategy,
    TableSpec,
    _check_int,
    _check_tables,
    _parse_strategy,
)

# The auto planner stops searching once the fullest rank holds at most this much more than
# the mean: more slicing would only add small pieces to the alltoall packing.
_GOOD_ENOUGH_IMBALANCE = 1.05
# Bounds planning time for very many tables x ranks; the fully sliced plan is always tried.
_MAX_AUTO_CANDIDATES = 256


def split_columns(dim: int, num_slices: int, *, table_name: str | None = None
                  ) -> tuple[tuple[int, int], ...]:
    """Cuts `dim` columns into `num_slices` contiguous `[start, end)` ranges.

    Widths differ by at most one: the first `dim % num_slices` ranges get the extra column.
    `table_name` only names the table in errors.

    Raises:
        ValueError: Unless `1 <= num_slices <= dim`.
    """
    _check_int("dim", dim, 1)
    if isinstance(num_slices, bool) or not isinstance(num_slices, int) or not 0 < num_slices <= dim:
        table = f"table {table_name!r}" if table_name else "a table"
        raise ValueError(f"Cannot split {table} of dim {dim} into {num_slices} column slices: "
                         f"each slice needs at least one column. Expected 1 <= num_slices <= "
                         f"{dim}. Received: num_slices={num_slices}")
    width, extra = divmod(dim, num_slices)
    # Slice i starts after i full-width slices plus one extra column for each earlier wide slice.
    starts = [index * width + min(index, extra) for index in range(num_slices + 1)]
    return tuple(zip(starts[:-1], starts[1:]))


def split_rows(rows: int, num_bands: int) -> tuple[tuple[int, int], ...]:
    """Cuts `rows` into `num_bands` contiguous `[start, end)` bands, evenly (as :func:`split_columns`)."""
    return split_columns(rows, num_bands)


def grid_shape(world_size: int, dim: int, rows: int) -> tuple[int, int]:
    """`(row bands, column slices)` of a ``grid`` placement on `world_size` ranks: the most nearly square
    factorisation of `world_size` with no more bands than columns, capped by the table's rows and
    columns (a prime number of ranks gives column slices only)."""
    bands = max(d for d in range(1, int(world_size ** 0.5) + 1) if world_size % d == 0)
    columns = min(world_size // bands, dim)
    return min(bands, rows), columns


def _elements(tables, piece: TableSlice) -> int:
    """Values a slice holds: its rows times its width."""
    start, end = piece.rows_in(tables[piece.table].rows)
    return (end - start) * piece.width


def _assign(tables, counts: Mapping[int, int], world_size: int, bands: Mapping[int, int] | None = None):
    """Greedy placement: pieces largest first onto the least-loaded rank, ties to the lowest
    rank, never two pieces of one table on one rank. A table cut into `bands[t]` row bands has
    `bands[t] * counts[t]` pieces. Returns (slices per rank, loads)."""
    bands = bands or {}
    pieces = []
    for table, count in counts.items():
        spec = tables[table]
        for row_start, row_end in split_rows(spec.rows, bands.get(table, 1)):
            for start, end in split_columns(spec.dim, count, table_name=spec.name):
                pieces.append(((row_end - row_start) * (end - start), table, row_start, start, end, row_end))
    pieces.sort(key=lambda piece: (-piece[0], piece[1], piece[2], piece[3]))
    heap = [(0, rank) for rank in range(world_size)]
    holders = {table: set() for table in counts}
    owned = [[] for _ in range(world_size)]
    loads = [0] * world_size
    for size, table, row_start, start, end, row_end in pieces:
        skipped = []
        load, rank = heapq.heappop(heap)
        while rank in holders[table]:  # at most world_size pieces per table, so one is free
            skipped.append((load, rank))
            load, rank = heapq.heappop(heap)
        holders[table].add(rank)
        owned[rank].append(TableSlice(table, start, end, row_start, row_end).canonical(tables[table].rows))
        loads[rank] = load + size
        heapq.heappush(heap, (loads[rank], rank))
        for entry in skipped:
            heapq.heappush(heap, entry)
    return [sorted(s, key=lambda p: p.table) for s in owned], loads


def _auto_counts(tables, fewest: dict, most: dict) -> Iterator[dict]:
    """Slice counts for decreasing piece-size caps: the table-wise counts first, then each
    distinct count vector `ceil(elements / cap)` (clipped to [fewest, most]), fully sliced last."""
    counts = dict(fewest)
    yield dict(counts)
    # A table of size b needs more than s pieces once the cap falls below b / s.
    breakpoints = sorted(((tables[t].elements / s, t, s) for t in most for s in range(1, most[t])),
                         reverse=True)
    for index, (_, table, count) in enumerate(breakpoints):
        counts[table] = max(counts[table], count + 1)
        if index + 1 < len(breakpoints):
            _, other, other_count = breakpoints[index + 1]
            # Exact comparison of b/s: equal-size tables must change together.
            if tables[table].elements * other_count == tables[other].elements * count:
                continue
        yield dict(counts)


def _auto_assign(tables, fewest: dict, most: dict, world_size: int, base: int, bands: Mapping[int, int] | None = None):
    """Tries piece-size caps from "no slicing" down to "fully sliced" and keeps the best plan:
    fewest empty ranks, then lowest imbalance, then (by search order) fewest slices."""
    bands = bands or {}
    fewest_empty = max(0, world_size - sum(most[t] * bands.get(t, 1) for t in most))
    candidates = itertools.chain(
        itertools.islice(_auto_counts(tables, fewest, most), _MAX_AUTO_CANDIDATES), [most])
    best = best_key = None
    for counts in candidates:
        owned, loads = _assign(tables, counts, world_size, bands)
        imbalance = _imbalance(loads, base)
        key = (sum(not slices for slices in owned), imbalance)
        if best_key is None or key < best_key:
            best, best_key = owned, key
        if key[0] == fewest_empty and imbalance <= _GOOD_ENOUGH_IMBALANCE:
            break
    return best


def _imbalance(loads: Sequence[int], base: int) -> float:
    """max/mean elements per rank, with ``base`` (the replicated tables) held by every rank."""
    return (max(loads) + base) * len(loads) / (sum(loads) + len(loads) * base)


def _balance_widths(tables, owned: list, base: int, readers: Sequence[int]) -> list:
    """Moves small pieces off the rank with the most exchange columns while the memory imbalance
    stays within max(its own, 1.05): every rank looks up the global batch of each of its columns
    and sends them in the alltoall, so the widest rank sets the pace of both. A piece of a table
    read by ``k`` features sends ``k`` pooled vectors per sample (one per feature): ``k * width``
    exchange columns."""
    owned = [list(slices) for slices in owned]

    def size(piece):
        return _elements(tables, piece)

    def columns(piece):
        return piece.width * readers[piece.table]

    def loads():
        return [sum(size(p) for p in slices) for slices in owned]

    bound = max(_imbalance(loads(), base), _GOOD_ENOUGH_IMBALANCE)
    while True:
        widths, current = [sum(columns(p) for p in slices) for slices in owned], loads()
        widest, narrowest = widths.index(max(widths)), widths.index(min(widths))
        for piece in sorted(owned[widest], key=lambda p: (size(p), p.table)):
            if any(p.table == piece.table for p in owned[narrowest]) or widths[narrowest] + columns(piece) >= widths[widest]:
                continue
            trial = list(current)
            trial[widest] -= size(piece)
            trial[narrowest] += size(piece)
            if _imbalance(trial, base) <= bound:
                owned[widest].remove(piece)
                owned[narrowest] = sorted(owned[narrowest] + [piece], key=lambda p: p.table)
                break
        else:
            return owned


def make_plan(tables: Sequence[TableSpec], world_size: int, strategy: str | Strategy = "auto",
              data_parallel_threshold: int = 2048, column_slice_threshold: int | None = None,
              bytes_per_element: int = 4, readers: Sequence[int] | None = None,
              placements: Sequence[str] | None = None, kept_whole: Sequence[str | None] | None = None,
              row_slice_threshold: int | None = None) -> ShardingPlan:
    """Plans where each table lives on `world_size` ranks.

    Tables with fewer than `data_parallel_threshold` rows are replicated on every rank; the
    others are model-parallel, whole on rank 0 when `world_size == 1`. Otherwise `table_wise`
    puts whole tables, largest first, on the least-loaded rank (ties to the lowest rank);
    `column_wise` cuts every table into `min(world_size, dim)` slices on distinct ranks; `auto`
    starts table-wise and cuts the largest tables into more slices while that improves the
    memory balance or fills an empty rank, then cuts tall tables into `world_size` row bands
    (largest first, while the fullest rank holds over 1.25 times the mean and a cut lowers its bytes
    by more than 5%; only a table that column slices cannot spread over every rank: fewer columns
    than ranks, or kept whole: each band sends the table's whole width), then moves small pieces off the rank with the most
    exchange columns while the memory imbalance stays within max(its own, 1.05); a table read by
    several features counts `readers * width` exchange columns (each feature sends its own pooled
    vector, and each row band its own). In every strategy a table of more than
    `row_slice_threshold` elements is cut into `min(world_size, rows)` row bands, whole columns
    (NVIDIA distributed-embeddings' rule: row slicing comes before column slicing), and any other
    table of more than `column_slice_threshold` elements gets at least `ceil(elements / threshold)`
    column slices.

    Args:
        tables: Table specs in feature-spec order.
        world_size: Number of ranks, at least 1.
        strategy: A `Strategy` or its value.
        data_parallel_threshold: Row count under which a table is replicated, at least 0.
        column_slice_threshold: Elements above which a table is sliced; None for no limit.
        bytes_per_element: Bytes of one stored value (4 for float32 tables).
        readers: Per table, how many features read it (None: one each); see
            :func:`table_readers`.
        placements: Per table, ``auto`` (the strategy and thresholds decide), or a request the plan
            honours whatever the strategy: ``replicated`` (every rank, at any world size),
            ``table_wise`` (one slice), ``column_wise`` (``min(world_size, dim)`` slices),
            ``row_wise`` (``min(world_size, rows)`` row bands) or ``grid`` (row bands of column
            slices, :func:`grid_shape`).
        kept_whole: Per table, None, or why its columns must not be cut (its optimizer's state
            could not stay exact on slices): such a table is never column-sliced, whatever the
            strategy and the slice threshold (row bands keep every row whole and stay allowed), and
            a ``column_wise`` or ``grid`` placement of it is refused at every world size, one process
            included, so that a model is accepted or refused the same way on any number of ranks.
        row_slice_threshold: Elements above which a table is cut into row bands; None for no limit.

    Returns:
        A `ShardingPlan`; the same arguments always give the same plan.

    Raises:
        ValueError: On a bad world size, strategy, threshold or table list, or a ``column_wise``
            or ``grid`` placement of a table kept whole.
    """
    tables = tuple(tables)
    _check_int("world_size", world_size, 1)
    strategy = _parse_strategy(strategy)
    _check_int("data_parallel_threshold", data_parallel_threshold, 0)
    for name, threshold in (("column_slice_threshold", column_slice_threshold), ("row_slice_threshold", row_slice_threshold)):
        if threshold is not None:
            _check_int(name, threshold, 1)
    _check_int("bytes_per_element", bytes_per_element, 1)
    _check_tables(tables)
    readers = _check_readers(readers, tables)
    placements = _check_placements(placements, tables)
    kept_whole = _check_kept_whole(kept_whole, tables, placements)
    replicated = tuple(t for t, s in enumerate(tables)
                       if placements[t] == "replicated" or (placements[t] == "auto" and s.rows < data_parallel_threshold))
    model_parallel = [t for t in range(len(tables)) if t not in set(replicated)]
    if world_size == 1:
        rank_slices = [[TableSlice(t, 0, tables[t].dim) for t in model_parallel]]
    else:
        most = {t: min(world_size, tables[t].dim) for t in model_parallel}
        fewest = {t: 1 for t in model_parallel}
        bands = {}
        if column_slice_threshold is not None:
            # Integer ceiling: float division would round for tables above 2**53 elements.
            fewest = {t: min(most[t], -(-tables[t].elements // column_slice_threshold))
                      for t in model_parallel}
        for t in model_parallel:
            tall = row_slice_threshold is not None and tables[t].elements > row_slice_threshold
            if placements[t] == "row_wise" or (placements[t] == "auto" and tall):
                bands[t], fewest[t], most[t] = min(world_size, tables[t].rows), 1, 1
            elif placements[t] == "grid":
                bands[t], columns = grid_shape(world_size, tables[t].dim, tables[t].rows)
                fewest[t] = most[t] = columns
            elif placements[t] == "table_wise" or kept_whole[t] is not None:
                fewest[t] = most[t] = 1
            elif placements[t] == "column_wise":
                fewest[t] = most[t]
        if strategy is Strategy.TABLE_WISE:
            rank_slices, _ = _assign(tables, fewest, world_size, bands)
        elif strategy is Strategy.COLUMN_WISE:
            rank_slices, _ = _assign(tables, most, world_size, bands)
        else:
            base = sum(tables[t].elements for t in replicated)
            free = [t for t in model_parallel if placements[t] == "auto" and t not in bands]
            owned = _auto_assign(tables, fewest, most, world_size, base, bands)
            owned = _auto_row_bands(tables, fewest, most, world_size, base, bands, owned, free)
            rank_slices = _balance_widths(tables, owned, base, readers)
    return ShardingPlan(world_size=world_size, tables=tables, strategy=strategy.value,
                        replicated=replicated, rank_slices=rank_slices,
                        bytes_per_element=bytes_per_element)


# Row bands send a whole table's columns each (a band's owner pools every sample's ids in its rows): the
# auto planner cuts tables into bands only while the fullest rank holds more than this much over the mean,
# and only when the fullest rank then holds at least _ROW_BAND_GAIN less.
_ROW_BAND_IMBALANCE = 1.25
_ROW_BAND_GAIN = 0.95


def _auto_row_bands(tables, fewest: dict, most: dict, world_size: int, base: int, bands: dict, owned: list, free: list):
    """Cuts the largest `free` tables (auto placement, not yet banded) into `world_size` row bands, one at
    a time, while the plan's memory imbalance exceeds :data:`_ROW_BAND_IMBALANCE` and the fullest rank's
    elements fall below :data:`_ROW_BAND_GAIN` of what they were."""
    def loads(slices):
        return [sum(_elements(tables, p) for p in mine) for mine in slices]

    def fullest(slices):
        return max(loads(slices))

    for table in sorted(free, key=lambda t: (-tables[t].elements, t)):
        if _imbalance(loads(owned), base) <= _ROW_BAND_IMBALANCE:
            break
        # Only where column slices cannot spread the table over every rank (fewer columns than ranks, or
        # kept whole): bands cost the exchange a whole table's columns each.
        if tables[table].rows < world_size or most[table] >= world_size:
            continue
        trial_bands = {**bands, table: world_size}
        trial_fewest, trial_most = {**fewest, table: 1}, {**most, table: 1}
        trial = _auto_assign(tables, trial_fewest, trial_most, world_size, base, trial_bands)
        if fullest(trial) >= _ROW_BAND_GAIN * fullest(owned):
            break
        owned, bands, fewest, most = trial, trial_bands, trial_fewest, trial_most
    return owned


def table_readers(feature_tables: Sequence[int], num_tables: int) -> tuple[int, ...]:
    """How many features read each table, from the table index of every feature."""
    counts = [0] * num_tables
    for table in feature_tables:
        counts[table] += 1
    return tuple(counts)


PLACEMENTS = ("auto", "table_wise", "column_wise", "row_wise", "grid", "replicated")


def _check_placements(placements, tables) -> tuple[str, ...]:
    if placements is None:
        return ("auto",) * len(tables)
    placements = tuple(placements)
    if len(placements) != len(tables):
        raise ValueError(f"Expected one placement per table ({len(tables)}). Received: placements={list(placements)}")
    for table, placement in zip(tables, placements):
        if placement not in PLACEMENTS:
            raise ValueError(f"Expected the placement of table {table.name!r} in {list(PLACEMENTS)}. "
                             f"Received: {placement!r}")
    return placements


def _check_kept_whole(kept_whole, tables, placements) -> tuple[str | None, ...]:
    if kept_whole is None:
        return (None,) * len(tables)
    kept_whole = tuple(kept_whole)
    if len(kept_whole) != len(tables):
        raise ValueError(f"Expected one kept_whole entry per table ({len(tables)}). Received: kept_whole={list(kept_whole)}")
    for table, placement, reason in zip(tables, placements, kept_whole):
        if reason is not None and placement in ("column_wise", "grid"):
            raise ValueError(f"Table {table.name!r} cannot be placed {placement}: {reason}")
    return kept_whole


def _check_readers(readers, tables) -> tuple[int, ...]:
    if readers is None:
        return (1,) * len(tables)
    readers = tuple(readers)
    if len(readers) != len(tables):
        raise ValueError(f"Expected one reader count per table ({len(tables)}). Received: readers={list(readers)}")
    for table, count in zip(tables, readers):
        _check_int("readers", count, 0, f" of table {table.name!r}")
    return readers
