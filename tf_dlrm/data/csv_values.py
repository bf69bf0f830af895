"""The per-value functions of the csv transcoder: a block of csv lines -> label, numerical and id arrays.

Pure Python and numpy (no TensorFlow, no FeatureSpec): the local engine (:mod:`tf_dlrm.data.transcode`)
and the Spark engine (:mod:`tf_dlrm.data.transcode_spark`) call :func:`parse_block` and
:func:`count_block` on the same lines, which is what makes their outputs identical byte for byte; every
row's values depend on that row alone (never on block boundaries).

Numerical transforms (``transform: {feature: step or [steps]}``), applied in order to the float64 value
before it is cast to the feature's dtype:

- ``{clip: [lo, hi]}``: ``min(max(x, lo), hi)``; either bound may be ``null`` (open);
- ``log1p``: ``log(1 + x)``; a value below 0 is an error naming the file, line and column (clip it
  first, ``[{clip: [0, null]}, log1p]``, to map negatives to 0 as the Criteo preprocessing does).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Sequence

import numpy as np

from tf_dlrm.data.csv_vocabulary import Vocabulary, count_cells

# Ids of a multi-hot cell ("12|7|99"): a character no number and no csv delimiter we accept uses.
MULTI_HOT_SEPARATOR = "|"

LABEL, NUMERICAL, CATEGORICAL, HASHED, VOCABULARY = "label", "numerical", "categorical", "hashed", "vocabulary"
# A weighted feature's weights: a cell of one number per id of the feature's cell, separated like its ids.
WEIGHTS = "weights"
LOG1P = "log1p"


class TranscodeError(ValueError):
    """The csv input is not valid; the message names the file, line and column."""


def hash_key(feature: str, cell: str) -> int:
    """The int64 key of a raw categorical value (``encode: hash``)."""
    digest = hashlib.blake2b(feature.encode("utf-8") + b"\0" + cell.strip().encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


@dataclasses.dataclass(frozen=True)
class Clip:
    low: float | None
    high: float | None


@dataclasses.dataclass(frozen=True)
class Column:
    """One used csv column: where it goes and how its cells are checked and converted."""

    feature: str
    index: int
    kind: str
    dtype: np.dtype
    cardinality: int | None = None
    hotness: int = 1
    ragged: bool = False  # a multi-hot cell holds 0 to hotness ids (rows end in -1 past their length)
    transforms: tuple = ()  # numerical only: Clip or LOG1P, in order
    vocabulary: Vocabulary | None = None
    by_name: bool = False  # a Parquet column: found by its name, not its position
    weights_of: str = ""  # a weights column: the weighted feature whose ids it weighs

    def describe(self) -> str:
        return f"column '{self.feature}'" if self.by_name else f"column {self.index + 1} ('{self.feature}')"


@dataclasses.dataclass(frozen=True)
class CsvLayout:
    """Everything a block needs: the file's column count and delimiter, and the used columns."""

    features: tuple[str, ...]
    delimiter: str
    label: Column
    numerical: tuple[Column, ...]
    categorical: tuple[Column, ...]
    weights: tuple[Column, ...] = ()  # the weighted features' weights columns


def _cell_error(column: Column, cell: str) -> str | None:
    """Why one cell is invalid for its column, or None when it is valid."""
    text = cell.strip()
    if not text:
        return f"missing value in {column.describe()}"
    if column.kind == CATEGORICAL:
        try:
            value = int(text)
        except ValueError:
            return f"{column.describe()}: categorical id {cell!r} is not an integer"
        if not 0 <= value < column.cardinality:
            return f"{column.describe()}: categorical id {value} is outside [0, {column.cardinality})"
        return None
    try:
        value = float(text)
    except ValueError:
        return f"{column.describe()}: {cell!r} is not a number"
    if column.kind == LABEL and value not in (0.0, 1.0):
        return f"{column.describe()}: label must be 0 or 1. Received: {cell!r}"
    if not np.isfinite(value):
        return f"{column.describe()}: {cell!r} is not a finite number"
    if column.kind == NUMERICAL:
        transformed = _transform(column, np.array([value]))
        if LOG1P in column.transforms and np.isnan(transformed[0]):
            return (f"{column.describe()}: log1p of the negative value {cell.strip()} (the transform takes values >= 0; "
                    f"declare [{{clip: [0, null]}}, log1p] to map negatives to 0)")
        if abs(transformed[0]) > float(np.finfo(column.dtype).max):
            return f"{column.describe()}: {transformed[0]} overflows the feature's dtype {column.dtype}"
    return None


def _transform(column: Column, values: np.ndarray) -> np.ndarray:
    """The column's transforms in order; a negative value under log1p becomes NaN (reported by the caller)."""
    for step in column.transforms:
        if step == LOG1P:
            values = np.where(values < 0, np.nan, np.log1p(np.maximum(values, 0)))
        else:
            values = np.clip(values, -np.inf if step.low is None else step.low, np.inf if step.high is None else step.high)
    return values


def _first_bad_cell(column: Column, cells: np.ndarray) -> tuple[int, str] | None:
    for row, cell in enumerate(cells.tolist()):
        reason = _cell_error(column, cell)
        if reason:
            return row, reason
    return None


def _parse_multi_hot(column: Column, cells: np.ndarray) -> tuple[np.ndarray | None, int, str]:
    """A multi-hot column: each cell holds exactly ``hotness`` ids separated by ``|`` ("12|7|99"), or
    0 to ``hotness`` of a variable-length feature (``ragged``: an empty cell holds none)."""
    if column.ragged:
        return _parse_variable_length(column, cells)
    lists = [cell.split(MULTI_HOT_SEPARATOR) for cell in cells.tolist()]
    for row, ids in enumerate(lists):
        if len(ids) != column.hotness:
            more = "more" if len(ids) > column.hotness else "fewer"
            return None, row, (f"{column.describe()}: {len(ids)} ids in {str(cells[row])!r}, {more} than the feature's hotness "
                               f"{column.hotness} (a multi-hot cell holds exactly hotness ids separated by "
                               f"{MULTI_HOT_SEPARATOR!r}; there is no pad id)")
    flat = np.array([text for ids in lists for text in ids], dtype=str)
    values, row, reason = parse_column(dataclasses.replace(column, hotness=1), flat)
    if values is None:
        return None, row // column.hotness, reason
    return values.reshape(len(lists), column.hotness), -1, ""


def _parse_variable_length(column: Column, cells: np.ndarray) -> tuple[np.ndarray | None, int, str]:
    """``[n, hotness]`` ids of a variable-length column, each row ending in -1 past its own length
    (what :class:`tf_dlrm.data.split_binary.SplitBinaryWriter` stores with a lengths file)."""
    lists = [cell.split(MULTI_HOT_SEPARATOR) if cell.strip() else [] for cell in cells.tolist()]
    lengths = np.fromiter((len(ids) for ids in lists), np.int64, count=len(lists))
    if lengths.size and lengths.max() > column.hotness:
        row = int(np.argmax(lengths > column.hotness))
        return None, row, (f"{column.describe()}: {lengths[row]} ids in {str(cells[row])!r}, more than the feature's "
                           f"hotness {column.hotness} (a variable-length cell holds 0 to hotness ids separated by "
                           f"{MULTI_HOT_SEPARATOR!r})")
    flat = np.array([text for ids in lists for text in ids], dtype=str)
    values, position, reason = parse_column(dataclasses.replace(column, hotness=1, ragged=False), flat)
    if values is None:
        return None, int(np.searchsorted(np.cumsum(lengths), position, side="right")), reason
    rows = np.full((len(lists), column.hotness), -1, np.int64)
    rows[np.arange(column.hotness)[None, :] < lengths[:, None]] = values
    return rows, -1, ""


def parse_column(column: Column, cells: np.ndarray) -> tuple[np.ndarray | None, int, str]:
    """Parses a column of cells with numpy; on failure returns (None, row, reason) of the first bad cell."""
    if column.kind == HASHED:  # any text is a valid raw value
        return np.fromiter((hash_key(column.feature, cell) for cell in cells.tolist()), np.int64, count=len(cells)), -1, ""
    if column.kind == VOCABULARY:  # any text too: unknown values get the out-of-vocabulary id
        return column.vocabulary.lookup(cells.tolist(), _vocabulary_index(column.vocabulary)), -1, ""
    if column.hotness > 1:
        return _parse_multi_hot(column, cells)
    try:
        if column.kind == CATEGORICAL:
            values = cells.astype(np.int64)
            valid = (values >= 0) & (values < column.cardinality)
        else:
            values = cells.astype(np.float64)
            valid = np.isfinite(values)
            if column.kind == LABEL:
                valid &= (values == 0) | (values == 1)
            else:
                with np.errstate(invalid="ignore"):
                    values = _transform(column, values)
                    valid &= np.abs(values) <= float(np.finfo(column.dtype).max)  # NaN (log1p of x < 0) fails too
        if valid.all():
            return values, -1, ""
    except (ValueError, OverflowError):
        pass
    found = _first_bad_cell(column, cells)
    if found is None:  # numpy rejected a cell Python accepts: the precise scan decides
        if column.kind == CATEGORICAL:
            return np.array([int(cell) for cell in cells.tolist()], dtype=np.int64), -1, ""
        values = np.array([float(cell) for cell in cells.tolist()], dtype=np.float64)
        return (_transform(column, values) if column.kind == NUMERICAL else values), -1, ""
    return None, found[0], found[1]


_INDEX_CACHE: dict[int, tuple[Vocabulary, dict]] = {}


def _vocabulary_index(vocabulary: Vocabulary) -> dict[str, int]:
    """value -> id, built once per vocabulary object (the blocks of a pass share it)."""
    cached = _INDEX_CACHE.get(id(vocabulary))
    if cached is None or cached[0] is not vocabulary:
        cached = (vocabulary, vocabulary.index())
        _INDEX_CACHE.clear()  # one pass at a time holds its vocabularies; keep memory bounded
        _INDEX_CACHE[id(vocabulary)] = cached
    return cached[1]


def split_lines(layout: CsvLayout, path: str, first_line: int, lines: Sequence[str]) -> np.ndarray:
    """``[rows, columns]`` cells of lines without their newline; a row of the wrong width is an error."""
    rows = [line.split(layout.delimiter) for line in lines]
    widths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    wrong = np.flatnonzero(widths != len(layout.features))
    if wrong.size:
        row = int(wrong[0])
        raise TranscodeError(
            f"{path}, line {first_line + row}: expected {len(layout.features)} columns separated by "
            f"{layout.delimiter!r} ({', '.join(layout.features)}). Received {widths[row]}"
        )
    return np.array(rows, dtype=str).reshape(len(rows), len(layout.features))


def parse_block(layout: CsvLayout, path: str, first_line: int, lines: Sequence[str]):
    """``(label bool [n], numerical float64 [n, F] or None, [int64 ids per categorical])`` of csv lines.

    ``lines`` carry no newline; ``first_line`` is the 1-based line number of ``lines[0]`` in ``path``.
    Raises TranscodeError naming the file, line and column of a bad cell.
    """
    return parse_cells(layout, split_lines(layout, path, first_line, lines), lambda row: f"{path}, line {first_line + row}")


def parse_cells(layout: CsvLayout, table: np.ndarray, where):
    """:func:`parse_block` of ``[rows, columns]`` cells (text, in ``layout.features`` order); ``where(row)``
    names the file and line (or row) of a bad cell in the TranscodeError."""

    def parse(column: Column) -> np.ndarray:
        values, row, reason = parse_column(column, table[:, column.index])
        if values is None:
            raise TranscodeError(f"{where(row)}: {reason}")
        return values

    label = parse(layout.label).astype(bool)
    numerical = np.stack([parse(c) for c in layout.numerical], axis=1) if layout.numerical else None
    categorical = [parse(c) for c in layout.categorical]
    position = {c.feature: index for index, c in enumerate(layout.categorical)}
    for column in layout.weights:
        index = position[column.weights_of]
        categorical[index] = _weighted(column, table[:, column.index], categorical[index], where)
    return label, numerical, categorical


def _weighted(column: Column, cells: np.ndarray, rows: np.ndarray, where) -> tuple:
    """``(ids, lengths, weights)`` of a weighted feature: its ``[n, hotness]`` rows (ending in -1 past their
    length) and its weights column's cells, one number per id; a cell whose count differs from its ids' is
    an error naming the row and both columns."""
    lists = [cell.split(MULTI_HOT_SEPARATOR) if cell.strip() else [] for cell in cells.tolist()]
    lengths = (rows >= 0).sum(axis=1)
    counts = np.fromiter((len(w) for w in lists), np.int64, count=len(lists))
    wrong = np.flatnonzero(counts != lengths)
    if wrong.size:
        row = int(wrong[0])
        raise TranscodeError(f"{where(row)}: {column.describe()}: {counts[row]} weights in {str(cells[row])!r} for the "
                             f"{lengths[row]} ids of feature '{column.weights_of}' (one weight per id, separated by "
                             f"{MULTI_HOT_SEPARATOR!r})")
    flat = np.array([text for weights in lists for text in weights], dtype=str)
    numbers = dataclasses.replace(column, kind=NUMERICAL, hotness=1, ragged=False, dtype=np.dtype(np.float32))
    values, position, reason = parse_column(numbers, flat)
    if values is None:
        raise TranscodeError(f"{where(int(np.searchsorted(np.cumsum(counts), position, side='right')))}: {reason}")
    return rows[rows >= 0], lengths, values.astype(np.float32)


def count_block(layout: CsvLayout, features: Sequence[str], path: str, first_line: int, lines: Sequence[str],
                counts: dict[str, dict[str, int]]) -> None:
    """Adds the stripped cells of the named (vocabulary) features to ``counts[feature]``."""
    count_table(layout, features, split_lines(layout, path, first_line, lines), counts)


def count_table(layout: CsvLayout, features: Sequence[str], table: np.ndarray, counts: dict[str, dict[str, int]]) -> None:
    """:func:`count_block` of ``[rows, columns]`` cells."""
    position = {feature: index for index, feature in enumerate(layout.features)}
    for feature in features:
        count_cells(table[:, position[feature]].tolist(), counts.setdefault(feature, {}))
