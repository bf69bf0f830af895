"""Parquet columns as the csv transcoder's cells: ``type: parquet`` chunks of :mod:`tf_dlrm.data.transcode`.

A Parquet file's columns are found by name (the chunk's ``features``; other columns are not read) and
read in blocks of rows (``iter_batches``, across row groups). Each value becomes the text a csv cell
would hold for it, and the block goes through the same :func:`tf_dlrm.data.csv_values.parse_cells`
as csv lines: the same checks, encodings (``vocabulary``, ``hash``) and transforms, so the same data
as csv or as Parquet transcodes to the same bytes.

- integers and strings (``dictionary``-encoded ones too, as pandas writes a ``category`` column) as
  their text; floats by their shortest round-trip text of the float64 value; booleans as ``1``/``0``;
- a null as an empty cell: an error for a label, numerical value or id (as csv's empty cell), the
  value ``""`` for an encoded column;
- a list column (Parquet ``LIST``, as pandas writes a column of Python lists) holds a multi-hot
  feature: each row's ids (integers or strings) joined as csv's ``12|7|99``, so a row must hold
  exactly ``hotness`` ids; a null list reads as an empty cell, a null id as an empty id.

Types are checked from the file's schema before any row is read: labels take integers, booleans,
floats or strings; numerical values integers, floats or strings; ids integers or strings (or lists
of them); encoded columns integers or strings. A float id column is refused (pandas writes an
integer column holding missing values as float64: fill them, or use pandas' nullable ``Int64``).
Errors name the file and column, and the row (0-based, as ``DataFrame.iloc``) where one is at fault.

Needs ``pyarrow`` (``pip install tf_dlrm[parquet]``).
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from tf_dlrm.data.csv_values import (CATEGORICAL, HASHED, LABEL, MULTI_HOT_SEPARATOR, NUMERICAL, VOCABULARY, WEIGHTS,
                                     TranscodeError)


def require_pyarrow():
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError as error:
        raise ImportError(f"type: parquet chunks need pyarrow (pip install 'tf_dlrm[parquet]'): {error}") from error
    return pyarrow


def _kinds(data_type, pa) -> set[str]:
    """The kinds of values a Parquet type holds: ``integer``, ``float``, ``bool``, ``string``, ``null``, ``list``."""
    types = pa.types
    if types.is_dictionary(data_type):
        return _kinds(data_type.value_type, pa)
    if types.is_integer(data_type):
        return {"integer"}
    if types.is_floating(data_type):
        return {"float"}
    if types.is_boolean(data_type):
        return {"bool"}
    if types.is_string(data_type) or types.is_large_string(data_type):
        return {"string"}
    if types.is_null(data_type):
        return {"null"}
    if types.is_list(data_type) or types.is_large_list(data_type) or types.is_fixed_size_list(data_type):
        return {"list"} | {f"list of {kind}" for kind in _kinds(data_type.value_type, pa)}
    return set()


_ALLOWED = {
    LABEL: ({"integer", "bool", "float", "string"}, "0/1 labels (integers, booleans, floats or strings)"),
    NUMERICAL: ({"integer", "float", "string"}, "numbers (integers, floats or strings)"),
    CATEGORICAL: ({"integer", "string", "list of integer", "list of string", "list of null"},
                  "integer ids (integers or strings, or lists of them for a multi-hot feature)"),
    HASHED: ({"integer", "string"}, "raw values to encode (integers or strings)"),
    VOCABULARY: ({"integer", "string"}, "raw values to encode (integers or strings)"),
    WEIGHTS: ({"list of float", "list of integer", "list of string", "list of null"},
              "lists of weights, one number per id of the weighted feature"),
}


def check_schema(path: str, schema, columns: Sequence) -> None:
    """Every used column (:class:`~tf_dlrm.data.csv_values.Column`) is in the file with a type its kind takes."""
    pa = require_pyarrow()
    names = list(schema.names)
    for column in columns:
        if column.feature not in names:
            raise TranscodeError(f"{path}: no column '{column.feature}' (a feature of the chunk). The file's columns: {names}")
        data_type = schema.field(column.feature).type
        kinds = _kinds(data_type, pa)
        allowed, what = _ALLOWED[column.kind]
        if "null" in kinds or kinds & allowed:
            continue
        hint = ""
        if column.kind == CATEGORICAL and "float" in kinds:
            hint = (" (pandas writes an integer column holding missing values as float64: fill them, or use the "
                    "nullable 'Int64' dtype)")
        raise TranscodeError(f"{path}: column '{column.feature}' has Parquet type {data_type}; expected {what}{hint}")


def _scalar_text(array, pa):
    """The csv text of each value of a scalar Arrow array, as an Arrow string array (nulls stay null).

    Arrow writes a float64 as its shortest round-trip text (``0.1``, ``1e+16``): read back, the same value."""
    import pyarrow.compute as compute

    data_type = array.type
    if pa.types.is_dictionary(data_type):
        array = array.dictionary_decode()
        data_type = array.type
    if pa.types.is_null(data_type):
        return pa.nulls(len(array), pa.string())
    if pa.types.is_boolean(data_type):
        array = compute.cast(array, pa.int8())
    elif pa.types.is_floating(data_type):
        # float64 first: a float32's own shortest text would read back as another float64 value.
        array = compute.cast(array, pa.float64())
    return compute.cast(array, pa.string())


def _is_list(data_type, pa) -> bool:
    return pa.types.is_list(data_type) or pa.types.is_large_list(data_type) or pa.types.is_fixed_size_list(data_type)


def column_cells(array, pa) -> np.ndarray:
    """The csv cells (str) of one Arrow column: lists joined by ``|``, nulls as empty cells."""
    import pyarrow.compute as compute

    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if _is_list(array.type, pa):
        values = _scalar_text(array.flatten(), pa)
        if array.null_count == 0 and values.null_count == 0 and not pa.types.is_fixed_size_list(array.type):
            offsets = array.offsets  # of a slice (a block of a row group) they start past 0: rebase them
            offsets = compute.subtract(offsets, offsets[0]).cast(offsets.type)
            joined = compute.binary_join(array.from_arrays(offsets, values), MULTI_HOT_SEPARATOR)
            return joined.to_numpy(zero_copy_only=False).astype(str)
        # Nulls: a null id is an empty id, a null list an empty cell (binary_join would null the whole row).
        items = ["" if value is None else value for value in values.to_pylist()]
        offsets = np.asarray(array.offsets) if not pa.types.is_fixed_size_list(array.type) else None
        cells, position = [], 0
        for row, valid in enumerate(array.is_valid().to_pylist()):
            length = 0 if not valid else (array.type.list_size if offsets is None else int(offsets[row + 1] - offsets[row]))
            cells.append(MULTI_HOT_SEPARATOR.join(items[position:position + length]) if valid else "")
            position += length
        return np.array(cells, dtype=str)
    return compute.fill_null(_scalar_text(array, pa), "").to_numpy(zero_copy_only=False).astype(str)


def _null_expected(column) -> str | None:
    """What a null of ``column`` stands in place of when a null is an error there (None: it reads as an
    empty value: an encoded column's ``""``, a variable-length feature's empty list)."""
    if column.hotness > 1 and not column.ragged:
        return f"a list of exactly {column.hotness} ids (hotness {column.hotness}; a variable-length feature, ragged: " \
               "true, would read a null list as no ids)"
    return {LABEL: "a label 0 or 1", NUMERICAL: "a number", CATEGORICAL: "an id"}.get(column.kind)


def _check_nulls(path: str, first: int, batch, used: Sequence) -> None:
    """Refuses a null where a value is needed, naming the file, row and column (read as an empty cell it
    got csv's messages, about ``|`` separators and empty cells that a Parquet file does not have)."""
    for column in used:
        array = batch.column(column.feature)
        expected = _null_expected(column)
        if expected is None or not array.null_count:
            continue
        row = int(np.flatnonzero(np.asarray(array.is_null().to_numpy(zero_copy_only=False)))[0])
        kind = "list" if column.hotness > 1 else "value"
        raise TranscodeError(f"{path}, row {first + row}, column '{column.feature}': the {kind} is null; expected {expected}")


def blocks(path: str, features: Sequence[str], used: Sequence, block_rows: int,
           row_groups: Sequence[int] | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """``(first row, [rows, len(features)] cells)`` of a Parquet file (or of its ``row_groups``, rows then counted
    from their start) in blocks of ``block_rows`` rows; only the ``used`` columns are read (the others' cells
    stay empty, as no layout reads them)."""
    pa = require_pyarrow()
    import pyarrow.parquet as pq

    try:
        handle = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as error:
        raise TranscodeError(f"{path}: not a readable Parquet file: {error}") from error
    with handle:
        check_schema(path, handle.schema_arrow, used)
        names = sorted({column.feature for column in used})
        position = {feature: index for index, feature in enumerate(features)}
        first = 0
        for batch in handle.iter_batches(batch_size=block_rows, row_groups=row_groups, columns=names):
            _check_nulls(path, first, batch, used)
            table = np.full((batch.num_rows, len(features)), "", dtype=object)
            for name in names:
                table[:, position[name]] = column_cells(batch.column(name), pa)
            yield first, table.astype(str)
            first += batch.num_rows
