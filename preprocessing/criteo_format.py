"""The Criteo click-log row format: detection, vectorised parsing, validation and the transform.

A Criteo row has 40 fields: ``label, I1..I13, C1..C26``. Inputs come as

- the 1TB ``day_N`` files and the Kaggle ``train.txt``: tab-separated, no header;
- Kaggle-style CSV: comma-separated with the header ``label,I1,...,I13,C1,...,C26``.

The delimiter is taken from the first line (a tab means TSV, else a comma means CSV); the first
line is a header when its first field is not a number, and then it must be the Criteo header.

Validation, per row (the first failing check names the reason):

- ``wrong_field_count``: not exactly 40 fields (an empty line has one field);
- ``bad_label``: the label is not ``0`` or ``1``;
- ``bad_integer``: an integer field is not ``-?[0-9]+`` (an integral float such as ``260.0`` or
  ``260.`` is accepted: a fraction of zeros only), or is longer than 18 characters;
- ``bad_categorical``: a categorical field is neither empty nor exactly 8 hex digits.

Transform: integers ``x`` -> ``log(1 + max(x, 0))`` computed in float64 and rounded to float16 (a
missing value is 0); categorical hashes -> their 32-bit value (``-1`` for missing), mapped to ids by
:mod:`preprocessing.vocabulary`.

Everything here works on a *block*: bytes holding whole lines, each ending with ``\\n``. Parsing
is vectorised with numpy (no per-field Python loop; see :mod:`preprocessing.field_decoding`), and
both engines call the same functions, which is what makes their outputs identical byte for byte.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from preprocessing.field_decoding import decode_hashes, decode_integers, words_ending_at

NUM_INTEGER = 13
NUM_CATEGORICAL = 26
NUM_FIELDS = 1 + NUM_INTEGER + NUM_CATEGORICAL
HEADER = ("label",) + tuple(f"I{i}" for i in range(1, NUM_INTEGER + 1)) + tuple(f"C{i}" for i in range(1, NUM_CATEGORICAL + 1))
MISSING = -1  # parsed value of an empty categorical field

WRONG_FIELD_COUNT = "wrong_field_count"
BAD_LABEL = "bad_label"
BAD_INTEGER = "bad_integer"
BAD_CATEGORICAL = "bad_categorical"
REASONS = (WRONG_FIELD_COUNT, BAD_LABEL, BAD_INTEGER, BAD_CATEGORICAL)

_NUMBER = re.compile(rb"^-?[0-9]+(\.[0-9]*)?$")


class CriteoFormatError(ValueError):
    """An input is not Criteo-shaped (wrong delimiter, field count or header)."""


class BadRowError(ValueError):
    """``--strict``: the first bad row, naming its file and line."""


@dataclasses.dataclass(frozen=True)
class InputFormat:
    """How one input file is laid out."""

    delimiter: bytes  # b"\t" or b","
    header: bool

    @property
    def name(self) -> str:
        return "tsv" if self.delimiter == b"\t" else "csv"


def normalize_line_ends(data: bytes) -> bytes:
    r"""Makes ``\r\n`` and a lone ``\r`` end lines like ``\n`` (as Hadoop's line reader does)."""
    if b"\r" in data:
        data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    return data


def detect_format(path: str, first_lines: list[bytes]) -> InputFormat:
    """Detects delimiter and header from a file's first lines (without line terminators).

    Raises:
        CriteoFormatError: the file is empty, has neither tabs nor commas, has a header that is
            not the Criteo header, or none of its first lines is a valid Criteo row.
    """
    if not first_lines:
        raise CriteoFormatError(f"{path}: the file is empty; expected Criteo rows (label, I1..I13, C1..C26)")
    first = first_lines[0]
    if b"\t" in first:
        delimiter = b"\t"
    elif b"," in first:
        delimiter = b","
    else:
        raise CriteoFormatError(
            f"{path}: not Criteo-shaped: line 1 has neither tabs nor commas; expected {NUM_FIELDS} "
            f"tab-separated (TSV) or comma-separated (CSV with header) fields. Received: {_show(first)}"
        )
    fields = first.split(delimiter)
    header = bool(fields[0].strip()) and not _NUMBER.match(fields[0].strip())
    if header:
        names = tuple(field.strip().decode("utf-8", "replace") for field in fields)
        if tuple(name.lower() for name in names) != tuple(name.lower() for name in HEADER):
            raise CriteoFormatError(
                f"{path}: not Criteo-shaped: line 1 does not start with a label, so it must be the Criteo "
                f"header '{','.join(HEADER[:3])},...,{HEADER[-1]}' ({NUM_FIELDS} names). Received: {_show(first)}"
            )
    input_format = InputFormat(delimiter=delimiter, header=header)
    sample = first_lines[1:] if header else first_lines
    if sample:
        block = b"\n".join(sample) + b"\n"
        parsed = parse_block(block, input_format)
        if not parsed.valid.any():
            row, reason, detail = parsed.bad_rows(1)[0]
            raise CriteoFormatError(
                f"{path}: not Criteo-shaped: none of the first {len(sample)} data lines is a valid row "
                f"(label, I1..I13, C1..C26 as {input_format.name.upper()}); "
                f"line {row + 1 + int(header)}: {reason}: {detail}"
            )
    return input_format


def _show(value: bytes, limit: int = 80) -> str:
    text = value.decode("utf-8", "replace")
    return repr(text if len(text) <= limit else text[:limit] + "...")


@dataclasses.dataclass
class ParsedBlock:
    """The rows of one block.

    Attributes:
        num_lines: lines in the block.
        valid: ``[num_lines]`` bool, the rows that passed validation.
        reason: ``[num_lines]`` int8, index into :data:`REASONS` for bad rows, -1 for valid ones.
        label: ``[num_valid]`` uint8 0/1.
        integers: ``[num_valid, 13]`` int64, negatives already clipped to 0, missing as 0.
        categorical: ``[num_valid, 26]`` int64 hash values, :data:`MISSING` for empty fields.
    """

    data: bytes
    delimiter: bytes
    num_lines: int
    valid: np.ndarray
    reason: np.ndarray
    bad_column: np.ndarray  # [num_lines] field index of the first bad field (-1 if none / count)
    field_counts: np.ndarray
    line_starts: np.ndarray
    line_ends: np.ndarray
    label: np.ndarray
    integers: np.ndarray
    categorical: np.ndarray

    def bad_rows(self, limit: int, rows: np.ndarray | None = None) -> list[tuple[int, str, str]]:
        """``(line index in block, reason, detail)`` of the first ``limit`` bad rows (of ``rows``)."""
        bad = np.flatnonzero(~self.valid)
        if rows is not None:
            bad = bad[rows[bad]]
        return [(int(row), REASONS[self.reason[row]], self.describe(int(row))) for row in bad[:limit]]

    def describe(self, row: int) -> str:
        """A human-readable detail of why ``row`` is bad (same text in both engines)."""
        line = self.data[self.line_starts[row] : self.line_ends[row]]
        reason = REASONS[self.reason[row]]
        if reason == WRONG_FIELD_COUNT:
            return f"{int(self.field_counts[row])} fields, expected {NUM_FIELDS}"
        column = int(self.bad_column[row])
        value = line.split(self.delimiter)[column]
        return f"column {HEADER[column]}: {_show(value, 40)}"

    def numerical(self) -> np.ndarray:
        """``[num_valid, 13]`` float16: ``log(1 + x)`` of the clipped integers."""
        return transform_integers(self.integers)


def transform_integers(integers: np.ndarray) -> np.ndarray:
    """``log(1 + x)`` in float64, rounded once to float16 (``x`` already clipped to ``>= 0``)."""
    return np.log1p(integers.astype(np.float64)).astype(np.float16)


def parse_block(data: bytes, input_format: InputFormat) -> ParsedBlock:
    r"""Parses and validates every line of ``data`` (whole lines, each ending with ``\n``)."""
    if data and not data.endswith(b"\n"):
        data += b"\n"
    raw = np.frombuffer(data, dtype=np.uint8)
    if input_format.delimiter == b"\t":  # tab (9) and newline (10) are adjacent: one comparison finds both
        separators = np.flatnonzero((raw - np.uint8(9)) < 2)
    else:
        separators = np.flatnonzero((raw == 10) | (raw == input_format.delimiter[0]))
    line_end_index = np.flatnonzero(raw[separators] == 10)  # index into `separators` of each '\n'
    num_lines = line_end_index.shape[0]
    field_counts = np.diff(line_end_index, prepend=-1)
    line_ends = separators[line_end_index]
    line_starts = np.concatenate([[0], line_ends[:-1] + 1]).astype(np.int64) if num_lines else np.zeros(0, np.int64)
    reason = np.full(num_lines, -1, dtype=np.int8)
    bad_column = np.full(num_lines, -1, dtype=np.int16)
    shaped = np.flatnonzero(field_counts == NUM_FIELDS)
    reason[field_counts != NUM_FIELDS] = REASONS.index(WRONG_FIELD_COUNT)

    # Where each field of the well-shaped lines ends (at its separator) and its length: [rows, 40].
    ends = separators[line_end_index[shaped][:, None] - (NUM_FIELDS - 1) + np.arange(NUM_FIELDS)]
    lengths = np.empty_like(ends)
    lengths[:, 0] = ends[:, 0] - line_starts[shaped]
    np.subtract(ends[:, 1:], ends[:, :-1] + 1, out=lengths[:, 1:])

    words = words_ending_at(data)
    numbers, negative, numbers_ok = decode_integers(
        words, raw, ends[:, : 1 + NUM_INTEGER], lengths[:, : 1 + NUM_INTEGER], has_dot=b"." in data
    )
    label_ok = numbers_ok[:, 0] & ~negative[:, 0] & (numbers[:, 0] <= 1) & (lengths[:, 0] > 0)
    hashes, hashes_ok = decode_hashes(words, ends[:, 1 + NUM_INTEGER :], lengths[:, 1 + NUM_INTEGER :])

    integers_ok = numbers_ok[:, 1:]
    row_reason = np.full(shaped.shape[0], -1, dtype=np.int8)
    row_column = np.full(shaped.shape[0], -1, dtype=np.int16)
    categorical_bad = ~hashes_ok.all(axis=1)
    row_reason[categorical_bad] = REASONS.index(BAD_CATEGORICAL)
    row_column[categorical_bad] = 1 + NUM_INTEGER + np.argmin(hashes_ok[categorical_bad], axis=1)
    integer_bad = ~integers_ok.all(axis=1)
    row_reason[integer_bad] = REASONS.index(BAD_INTEGER)
    row_column[integer_bad] = 1 + np.argmin(integers_ok[integer_bad], axis=1)
    row_reason[~label_ok] = REASONS.index(BAD_LABEL)
    row_column[~label_ok] = 0
    reason[shaped] = row_reason
    bad_column[shaped] = row_column

    good = row_reason < 0
    integers = np.where(negative[good, 1:], 0, numbers[good, 1:])
    return ParsedBlock(
        data=data,
        delimiter=input_format.delimiter,
        num_lines=num_lines,
        valid=reason < 0,
        reason=reason,
        bad_column=bad_column,
        field_counts=field_counts,
        line_starts=line_starts,
        line_ends=line_ends,
        label=numbers[good, 0].astype(np.uint8),
        integers=integers,
        categorical=hashes[good],
    )
