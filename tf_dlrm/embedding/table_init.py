"""Initial values of embedding tables that depend only on ``(seed, table)``, never on the sharding.

A table's rows are generated in fixed blocks of :data:`ROW_BLOCK` rows, each block from its own
counter-based stream keyed by ``(seed, table, block)``. Any rank can therefore produce exactly the
rows and columns it owns, and the full table that one process builds is bit-identical to the
union of the shards that N ranks build.

Values are uniform in ``[-bound, bound]``: ``bound = 1/sqrt(rows)`` (the DLRM reference
initialisation, ``init_bound=None``) or a fixed ``init_bound`` for every table (Keras's
``Embedding`` draws from ``[-0.05, 0.05]``).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

ROW_BLOCK = 16384


def check_init_bound(init_bound, name: str = "init_bound") -> float | None:
    """``None`` (1/sqrt(rows)) or a positive finite number, as float; raises naming ``name``."""
    if init_bound is None:
        return None
    if isinstance(init_bound, bool) or not isinstance(init_bound, numbers.Real) or not 0 < init_bound < math.inf:
        raise ValueError(f"Expected {name} to be None (1/sqrt(rows)) or a positive number. Received: {name}={init_bound!r}")
    return float(init_bound)


def table_bound(rows: int, init_bound: float | None = None) -> float:
    """The half-width of a table's uniform initial values."""
    return 1.0 / np.sqrt(rows) if init_bound is None else float(init_bound)


def _block_values(seed: int, table: int, block: int, rows_in_block: int, dim: int, bound: float) -> np.ndarray:
    generator = np.random.Generator(np.random.Philox(key=[seed & 0xFFFFFFFFFFFFFFFF, (table << 32) | block]))
    return generator.uniform(-bound, bound, size=(rows_in_block, dim)).astype(np.float32)


def initial_table_blocks(seed: int, table: int, rows: int, dim: int, column_start: int = 0, column_end: int | None = None,
                         init_bound: float | None = None, row_start: int = 0, row_end: int | None = None):
    """Yields ``(first row, [n, w] values)`` of columns ``[column_start, column_end)`` of rows ``[row_start,
    row_end)`` (a row band; ``first row`` counts from ``row_start``), block by block: a table larger than
    memory is initialised holding one block beside it."""
    column_end = dim if column_end is None else column_end
    row_end = rows if row_end is None else row_end
    if not 0 <= column_start < column_end <= dim:
        raise ValueError(f"Expected 0 <= column_start < column_end <= dim={dim}. Received: [{column_start}, {column_end})")
    if not 0 <= row_start < row_end <= rows:
        raise ValueError(f"Expected 0 <= row_start < row_end <= rows={rows}. Received: [{row_start}, {row_end})")
    bound = table_bound(rows, init_bound)
    for block in range(row_start // ROW_BLOCK, (row_end - 1) // ROW_BLOCK + 1):
        start, stop = block * ROW_BLOCK, min(rows, (block + 1) * ROW_BLOCK)
        low, high = max(start, row_start), min(stop, row_end)
        values = _block_values(seed, table, block, stop - start, dim, bound)
        yield low - row_start, values[low - start:high - start, column_start:column_end]


def initial_table_slice(
    seed: int, table: int, rows: int, dim: int, column_start: int = 0, column_end: int | None = None,
    init_bound: float | None = None,
) -> np.ndarray:
    """Columns ``[column_start, column_end)`` of table ``table``'s initial values, shape ``[rows, w]``."""
    column_end = dim if column_end is None else column_end
    out = np.empty((rows, column_end - column_start), dtype=np.float32)
    for start, values in initial_table_blocks(seed, table, rows, dim, column_start, column_end, init_bound):
        out[start:start + values.shape[0]] = values
    return out


def initial_table_rows(seed: int, table: int, rows: int, dim: int, ids, init_bound: float | None = None) -> np.ndarray:
    """Rows ``ids`` of table ``table``'s initial values, ``[len(ids), dim]``, generating only their blocks
    (hot-row replicas of tables too large to build whole)."""
    ids = np.asarray(ids, np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= rows):
        raise ValueError(f"Expected row ids in [0, {rows}). Received: min {ids.min()}, max {ids.max()}")
    bound = table_bound(rows, init_bound)
    out = np.empty((ids.size, dim), dtype=np.float32)
    for block in np.unique(ids // ROW_BLOCK):
        start = int(block) * ROW_BLOCK
        values = _block_values(seed, table, int(block), min(rows, start + ROW_BLOCK) - start, dim, bound)
        inside = (ids // ROW_BLOCK) == block
        out[inside] = values[ids[inside] - start]
    return out
