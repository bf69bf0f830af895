"""Sharded checkpoint tables: every rank writes and reads its own slices, chunk by chunk.

A table (or one optimizer slot of it) is saved as the slices its owners hold under the run's plan:
rank ``r`` writes ``tables/table_<t>.npy`` when it holds table ``t`` whole,
``tables/table_<t>.cols_<a>-<b>.npy`` for columns ``[a, b)`` of it, and ``...rows_<i>-<j>...`` for a
row band ``[i, j)``; a replicated table is written once, by rank 0; row-wise optimizer state
(``[rows, 1]``, a copy in every column slice of a row) by the owner of column 0 of each band. Each
file is a plain ``[rows of its band, width]`` float32 ``.npy``, written in chunks of about
:data:`CHUNK_BYTES` read from the variable (hot-row replicas written over the owner's stale copies),
so no process ever holds more than its own slices plus one chunk, and the ranks write in parallel.
The manifest lists every table's slices by column range (and row band, when the table is cut into
bands)::

    {"name": ..., "rows": R, "dim": D, "slices": [{"columns": [0, 4], "file": ...}, ...]}
    {"name": ..., "rows": R, "dim": D, "slices": [{"columns": [0, 4], "rows": [0, 5000], "file": ...}, ...]}

Restoring under any world size and plan, each rank reads, for each slice it now owns, only the
intersecting rows and columns of the saved slices, chunk of rows by chunk of rows (file reads at an
offset, no memory map: a process's address-space limit then only needs its own slices), and the
hot-row replicas by row. A version-1 entry (one full-table ``file``) is a single slice ``[0, D)``.

No collective happens here: :mod:`tf_dlrm.checkpoint.checkpointer` gathers the ranks' records and errors.
"""

from __future__ import annotations

import time

import numpy as np

from tf_dlrm.checkpoint import store
from tf_dlrm.checkpoint.store import CheckpointError
from tf_dlrm.io import files

# A save's or restore's memory overhead grows with the chunk (likely freed chunks the allocator keeps), and
# tests/checkpoint/test_table_larger_than_a_process.py bounds that overhead: a few MiB keep it small while each
# write stays large.
CHUNK_BYTES = 4 << 20


def chunk_rows(width: int) -> int:
    return max(1, CHUNK_BYTES // (4 * max(1, width)))


def slice_file(prefix: str, table: int, columns: tuple[int, int], dim: int, rows: tuple[int, int] | None = None) -> str:
    """``prefix_<t>.npy`` for a whole table, ``prefix_<t>.cols_<a>-<b>.npy`` for columns ``[a, b)``,
    ``prefix_<t>.rows_<i>-<j>[.cols_<a>-<b>].npy`` for a row band ``[i, j)`` (``rows``: None for every row)."""
    start, end = columns
    name = f"{prefix}_{table:03d}"
    if rows is not None:
        name += f".rows_{rows[0]}-{rows[1]}"
    if (start, end) != (0, dim):
        name += f".cols_{start}-{end}"
    return f"{name}.npy"


def entry_slices(entry: dict, dim: int, row_wise: bool = False) -> list[tuple[int, int | None, int, int, str]]:
    """``[(row_start, row_end, column_start, column_end, file)]`` of a manifest entry, in row then column
    order (``row_end`` None: to the last row; a version-1 entry's one full-table file is the slice
    ``[0, D)``; row-wise state has the columns ``[0, 1)``)."""
    if "slices" not in entry:
        return [(0, None, 0, 1 if row_wise else dim, entry["file"])]
    pieces = []
    for s in entry["slices"]:
        band = s.get("rows")
        pieces.append((int(band[0]) if band else 0, int(band[1]) if band else None, int(s["columns"][0]),
                       int(s["columns"][1]), s["file"]))
    return sorted(pieces, key=lambda p: (p[0], p[2]))


# ---------------------------------------------------------------------- writing


def write_rows(root: str, name: str, rows: int, width: int, read_chunk) -> tuple[dict, bool]:
    """Writes a ``[rows, width]`` float32 ``.npy`` from ``read_chunk(start, stop)``, chunk by chunk.

    Returns its manifest entry (bytes, sha256, shape, dtype) and whether every value was finite.
    """
    finite = True
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)), "fortran_order": False, "shape": (rows, width)}

    def write(sink):
        nonlocal finite
        np.lib.format.write_array_header_1_0(sink, header)
        step = chunk_rows(width)
        for start in range(0, rows, step):
            values = np.ascontiguousarray(read_chunk(start, min(rows, start + step)), dtype=np.float32)
            finite = finite and bool(np.isfinite(values).all())
            sink.write(memoryview(values).cast("B"))  # bytes: len() of a 2-d view counts rows

    entry = store._write_file(root, name, write)
    return {**entry, "shape": [rows, width], "dtype": "float32"}, finite


def save_pieces(embedding, rank: int, root: str, arrays, file_records: dict, delay_s: float = 0.0) -> tuple[list, str | None]:
    """Writes every piece this rank owns of every array in ``arrays``; returns ``(records, error)``.

    ``arrays``: ``(key, table, state_of, row_wise)`` tuples, ``key`` naming the array (``"table"``
    or an optimizer slot), ``state_of`` None for the table itself. A record is
    ``{"key", "table", "columns", "file"}``; ``error`` names the first array holding NaN or inf, or
    the file that could not be written (writing stops there). ``file_records``: the manifest's
    ``files``, which gets each written file's size and sha256.
    """
    records = []
    for key, table, state_of, row_wise in arrays:
        rows, dim = embedding.cardinalities[table], embedding.plan.tables[table].dim
        for piece in embedding.table_pieces(table):
            if piece.replicated and rank != 0:
                continue  # every rank holds it: rank 0 writes it
            if row_wise and piece.column_start != 0:
                continue  # every slice of a row holds a copy of the row's state: column 0's owner writes it
            columns = (0, 1) if row_wise else (piece.column_start, piece.column_end)
            band = None if (piece.row_start, piece.row_end) == (0, rows) else (piece.row_start, piece.row_end)
            prefix = "tables/table" if key == "table" else f"optimizer/embedding_{key}_table"
            file = slice_file(prefix, table, columns, 1 if row_wise else dim, band)
            try:
                file_records[file], finite = write_rows(
                    root, file, piece.rows, columns[1] - columns[0],
                    lambda start, stop, p=piece: embedding.read_piece_rows(p, p.row_start + start, p.row_start + stop,
                                                                           state_of, row_wise))
            except OSError as failure:
                return records, f"cannot write {files.join(root, file)}: {failure}"
            if not finite:
                what = f"table '{embedding.plan.tables[table].name}'" + ("" if key == "table" else f" ({key} state)")
                return records, f"{what} holds NaN or inf"
            records.append({"key": key, "table": table, "columns": list(columns), "file": file,
                            **({"rows": list(band)} if band else {})})
            if delay_s:
                time.sleep(delay_s)
    return records, None


def manifest_entries(records: list, tables, key: str) -> list[dict]:
    """The manifest's per-table entries of one array ``key`` from every rank's records."""
    entries = []
    for table, spec in enumerate(tables):
        slices = sorted((r for r in records if r["key"] == key and r["table"] == table),
                        key=lambda r: (r.get("rows", [0])[0], r["columns"]))
        if slices:
            entry = {"table": table, "name": spec.name, "rows": spec.rows, "dim": spec.dim,
                     "slices": [{"columns": r["columns"], **({"rows": r["rows"]} if "rows" in r else {}), "file": r["file"]}
                                for r in slices]}
            if len(slices) == 1:
                entry["file"] = slices[0]["file"]  # one file holds it whole (as in version 1)
            entries.append(entry)
    return entries


# ---------------------------------------------------------------------- reading


class SavedSlice:
    """Row ranges of one saved ``[rows, width]`` float32 ``.npy`` slice, read at an offset."""

    def __init__(self, directory: str, name: str, rows: int, width: int):
        self.path, self.name, self.rows, self.width = files.join(directory, name), name, rows, width
        try:
            with files.open_file(self.path, "rb") as handle:
                version = np.lib.format.read_magic(handle)
                if version not in ((1, 0), (2, 0)):
                    raise ValueError(f".npy format version {version}")
                read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, fortran, dtype = read_header(handle)
                self.offset = handle.tell()
        except (ValueError, OSError, EOFError) as error:
            raise CheckpointError(f"checkpoint {directory}: file {name} is not a plain .npy array: {error}") from error
        if dtype != np.dtype(np.float32) or fortran or tuple(shape) != (rows, width):
            raise CheckpointError(
                f"checkpoint {directory}: file {name} holds {dtype} {tuple(shape)}{' (Fortran order)' if fortran else ''}; "
                f"expected float32 {(rows, width)}")

    def read(self, start: int, stop: int) -> np.ndarray:
        with files.open_file(self.path, "rb") as handle:
            handle.seek(self.offset + 4 * start * self.width)
            values = files.read_array(handle, np.float32, (stop - start) * self.width)
        if values.size != (stop - start) * self.width:
            raise CheckpointError(f"{self.path}: rows [{start}, {stop}) are past the end of the file")
        return values.reshape(stop - start, self.width)

    def read_ids(self, ids: np.ndarray) -> np.ndarray:
        out = np.empty((ids.size, self.width), np.float32)
        with files.open_file(self.path, "rb") as handle:
            for position, row in enumerate(ids):
                handle.seek(self.offset + 4 * int(row) * self.width)
                out[position] = files.read_array(handle, np.float32, self.width)
        return out


def open_slices(directory: str, entry: dict, rows: int, dim: int, row_wise: bool = False) -> list[tuple]:
    """The saved slices of one entry as ``(row_start, row_end, column_start, column_end, SavedSlice)``, checked:
    each readable with its shape, the row bands covering every row once and each band's slices every column once."""
    width = 1 if row_wise else dim
    bands: dict = {}
    for row_start, row_end, start, end, file in entry_slices(entry, dim, row_wise):
        bands.setdefault((row_start, rows if row_end is None else row_end), []).append((start, end, file))
    slices, covered_rows = [], 0
    for (row_start, row_end), pieces in sorted(bands.items()):
        if row_start != covered_rows or row_end <= row_start or row_end > rows:
            raise CheckpointError(f"checkpoint {directory}: {entry.get('name')!r} has row bands that do not cover rows "
                                  f"[0, {rows}) once: [{row_start}, {row_end}) after row {covered_rows}")
        band = "" if (row_start, row_end) == (0, rows) else f" in rows [{row_start}, {row_end})"
        covered = 0
        for start, end, file in pieces:
            if start != covered or end <= start or end > width:
                raise CheckpointError(f"checkpoint {directory}: {entry.get('name')!r} has slices that do not cover columns "
                                      f"[0, {width}) once{band}: [{start}, {end}) after column {covered}")
            slices.append((row_start, row_end, start, end, SavedSlice(directory, file, row_end - row_start, end - start)))
            covered = end
        if covered != width:
            raise CheckpointError(f"checkpoint {directory}: {entry.get('name')!r} has no slice for columns [{covered}, {width}){band}")
        covered_rows = row_end
    if covered_rows != rows:
        raise CheckpointError(f"checkpoint {directory}: {entry.get('name')!r} has no slice for rows [{covered_rows}, {rows})")
    return slices


def read_columns(slices, start: int, stop: int, column_start: int, column_end: int) -> np.ndarray:
    """Rows ``[start, stop)``, columns ``[column_start, column_end)`` of a table saved as ``slices``."""
    out = np.empty((stop - start, column_end - column_start), np.float32)
    for row_start, row_end, saved_start, saved_end, saved in slices:
        low, high = max(saved_start, column_start), min(saved_end, column_end)
        first, last = max(row_start, start), min(row_end, stop)
        if low < high and first < last:
            values = saved.read(first - row_start, last - row_start)
            out[first - start:last - start, low - column_start:high - column_start] = values[:, low - saved_start:high - saved_start]
    return out


def read_table(directory: str, entry: dict, row_wise: bool = False) -> np.ndarray:
    """One whole table (or optimizer state) of a checkpoint's manifest entry, its slices joined: for
    inspecting a checkpoint in one process (it must fit in memory)."""
    rows, dim = int(entry["rows"]), int(entry["dim"])
    slices = open_slices(directory, entry, rows, dim, row_wise)
    return read_columns(slices, 0, rows, 0, max(end for _, _, _, end, _ in slices))


def read_rows_by_id(slices, ids: np.ndarray) -> np.ndarray:
    """Whole rows ``ids`` of a table saved as ``slices`` (the hot-row replicas)."""
    width = max(end for _, _, _, end, _ in slices)
    out = np.zeros((ids.size, width), np.float32)
    for row_start, row_end, start, end, saved in slices:
        inside = (ids >= row_start) & (ids < row_end)
        if inside.any():
            out[inside, start:end] = saved.read_ids(ids[inside] - row_start)
    return out


def restore_pieces(embedding, table: int, slices, state_of=None, row_wise: bool = False) -> None:
    """Fills every piece this rank holds of ``table`` (or of its state) from the saved ``slices``,
    chunk by chunk, then its hot-row replicas."""
    for piece in embedding.table_pieces(table):
        columns = (0, 1) if row_wise else (piece.column_start, piece.column_end)
        step = chunk_rows(columns[1] - columns[0])
        for start in range(piece.row_start, piece.row_end, step):
            stop = min(piece.row_end, start + step)
            embedding.assign_piece_rows(piece, start, read_columns(slices, start, stop, *columns), state_of)
    embedding.set_hot_rows_from(table, lambda ids: read_rows_by_id(slices, ids), state_of)
