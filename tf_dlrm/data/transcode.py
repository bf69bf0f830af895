"""CSV -> split_binary: converts a "bring your own dataset" FeatureSpec with csv chunks.

The input spec names, for every split, exactly one chunk of ``type: csv`` whose ``features`` are the
file's columns in order (columns of features no channel uses are skipped) and whose ``files`` are
read one after the other::

    source_spec:
      train:
        - type: csv
          features: [label, num_0, num_1, cat_0, cat_1]
          files: [train_part0.csv, train_part1.csv]
          header: true        # optional, default false: the first line of each file names the columns
          delimiter: ","      # optional, default ","

Cells are plain values (no quoting): labels 0 or 1, numerical values finite numbers (stored as given:
apply transforms such as log(1+x) before), categorical ids integers in ``[0, cardinality)``. A
multi-hot feature (``hotness: h`` in its feature_spec entry) holds exactly ``h`` ids per cell separated
by ``|``, e.g. ``12|7|99`` for ``hotness: 3``; more or fewer ids is an error naming the line.

Raw categorical values (a city, a URL, an item hash) need no mapping of the user's: a chunk may set
``encode: {feature: hash}`` for a categorical feature declared a dynamic table (``dynamic: true``,
``dtype: int64``; :mod:`tf_dlrm.dynamic.spec`); each cell, stripped, becomes the int64 key
``blake2b(feature name + NUL + cell, 8 bytes)`` (little-endian, signed; an empty cell is a value like
any other). ``encode: vocabulary`` (ids by frequency) is not implemented yet and is refused.

Output: NVIDIA's per-split split_binary layout under ``output_dir`` and ``output_dir/feature_spec.yaml``
written last. Files are parsed in blocks of lines with numpy; a block that fails is rescanned cell by
cell only to name the first bad file, line and column. The output is staged in a temporary sibling
and published by a rename (:mod:`tf_dlrm.io.publish`): on any error nothing is published and a
dataset already in ``output_dir`` is left as it was; a directory holding other files, or the input
itself (transcoding in place), is refused.

Usage::

    python -m tf_dlrm.data.transcode --input_spec=my_data/feature_spec.yaml --output_dir=my_data/binary
"""

from __future__ import annotations

import hashlib
import itertools
import os
import sys
from typing import Any, Sequence

import numpy as np

from tf_dlrm.data.layout import with_split_binary_sources
from tf_dlrm.data.split_binary import SplitBinaryWriter
from tf_dlrm.feature_spec import CSV, FeatureSpec
from tf_dlrm.io.publish import staged_output

DEFAULT_BLOCK_LINES = 1 << 16
# Ids of a multi-hot cell ("12|7|99"): a character no number and no csv delimiter we accept uses.
MULTI_HOT_SEPARATOR = "|"


class TranscodeError(ValueError):
    """The csv input is not valid; the message names the file, line and column."""


ENCODINGS = ("hash",)


def hash_key(feature: str, cell: str) -> int:
    """The int64 key of a raw categorical value (``encode: hash``)."""
    digest = hashlib.blake2b(feature.encode("utf-8") + b"\0" + cell.strip().encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


class _Column:
    """One used csv column: where it goes and how its cells are checked."""

    def __init__(self, feature: str, index: int, kind: str, dtype: np.dtype, cardinality: int | None = None,
                 hotness: int = 1):
        self.feature, self.index, self.kind = feature, index, kind
        self.dtype, self.cardinality, self.hotness = dtype, cardinality, hotness

    def describe(self) -> str:
        return f"column {self.index + 1} ('{self.feature}')"


def _cell_error(column: _Column, cell: str) -> str | None:
    """Why one cell is invalid for its column, or None when it is valid."""
    text = cell.strip()
    if not text:
        return f"missing value in {column.describe()}"
    if column.kind == "categorical":
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
    if column.kind == "label" and value not in (0.0, 1.0):
        return f"{column.describe()}: label must be 0 or 1. Received: {cell!r}"
    if not np.isfinite(value):
        return f"{column.describe()}: {cell!r} is not a finite number"
    if column.kind == "numerical" and abs(value) > float(np.finfo(column.dtype).max):
        return f"{column.describe()}: {value} overflows the feature's dtype {column.dtype}"
    return None


def _first_bad_cell(column: _Column, cells: np.ndarray) -> tuple[int, str] | None:
    for row, cell in enumerate(cells.tolist()):
        reason = _cell_error(column, cell)
        if reason:
            return row, reason
    return None


def _parse_multi_hot(column: _Column, cells: np.ndarray) -> tuple[np.ndarray | None, int, str]:
    """A multi-hot column: each cell holds exactly ``hotness`` ids separated by ``|`` ("12|7|99")."""
    lists = [cell.split(MULTI_HOT_SEPARATOR) for cell in cells.tolist()]
    for row, ids in enumerate(lists):
        if len(ids) != column.hotness:
            more = "more" if len(ids) > column.hotness else "fewer"
            return None, row, (f"{column.describe()}: {len(ids)} ids in {str(cells[row])!r}, {more} than the feature's hotness "
                               f"{column.hotness} (a multi-hot cell holds exactly hotness ids separated by "
                               f"{MULTI_HOT_SEPARATOR!r}; there is no pad id)")
    flat = np.array([text for ids in lists for text in ids], dtype=str)
    values, row, reason = _parse_column(_Column(column.feature, column.index, column.kind, column.dtype, column.cardinality), flat)
    if values is None:
        return None, row // column.hotness, reason
    return values.reshape(len(lists), column.hotness), -1, ""


def _parse_column(column: _Column, cells: np.ndarray) -> tuple[np.ndarray | None, int, str]:
    """Parses a column of cells with numpy; on failure returns (None, row, reason) of the first bad cell."""
    if column.kind == "hashed":  # any text is a valid raw value
        return np.fromiter((hash_key(column.feature, cell) for cell in cells.tolist()), np.int64, count=len(cells)), -1, ""
    if column.hotness > 1:
        return _parse_multi_hot(column, cells)
    try:
        if column.kind == "categorical":
            values = cells.astype(np.int64)
            valid = (values >= 0) & (values < column.cardinality)
        else:
            values = cells.astype(np.float64)
            valid = np.isfinite(values)
            if column.kind == "label":
                valid &= (values == 0) | (values == 1)
            else:
                valid &= np.abs(values) <= float(np.finfo(column.dtype).max)
        if valid.all():
            return values, -1, ""
    except (ValueError, OverflowError):
        pass
    found = _first_bad_cell(column, cells)
    if found is None:  # numpy rejected a cell Python accepts: the precise scan decides
        parse = int if column.kind == "categorical" else float
        return np.array([parse(cell) for cell in cells.tolist()]), -1, ""
    return None, found[0], found[1]


class _SplitTranscoder:
    """Streams one split's csv files into a SplitBinaryWriter."""

    def __init__(self, spec: FeatureSpec, split: str, block_lines: int):
        chunks = spec.chunks(split)
        if len(chunks) != 1 or chunks[0]["type"] != CSV:
            types = [chunk["type"] for chunk in chunks]
            raise TranscodeError(
                f"{spec.source}: source_spec.{split}: expected exactly one chunk of type 'csv' holding all "
                f"features of the split. Received {len(chunks)} chunk(s) of type(s) {types}"
            )
        chunk = chunks[0]
        self.features = list(chunk["features"])
        self.header = chunk.get("header", False)
        self.delimiter = chunk.get("delimiter", ",")
        if not isinstance(self.header, bool):
            raise TranscodeError(f"{spec.source}: source_spec.{split}[0].header: expected true or false. Received: {self.header!r}")
        if not isinstance(self.delimiter, str) or not self.delimiter or "\n" in self.delimiter:
            raise TranscodeError(
                f"{spec.source}: source_spec.{split}[0].delimiter: expected a non-empty string. Received: {self.delimiter!r}"
            )
        self.paths = [spec.resolve(relative) for relative in chunk["files"]]
        self.block_lines = block_lines
        position = {feature: index for index, feature in enumerate(self.features)}
        self.label = _Column(spec.label_feature, position[spec.label_feature], "label", np.dtype(np.float64))
        self.numerical = [_Column(f, position[f], "numerical", spec.dtype(f)) for f in spec.numerical_features]
        encode = _check_encode(spec, split, chunk.get("encode", {}))
        self.categorical = [
            _Column(f, position[f], "hashed", np.dtype(np.int64)) if f in encode else
            _Column(f, position[f], "categorical", spec.dtype(f), int(spec.feature_spec[f]["cardinality"]), spec.hotness(f))
            for f in spec.categorical_features
        ]

    def write(self, writer: SplitBinaryWriter) -> int:
        for path in self.paths:
            self._write_file(path, writer)
        return writer.num_samples

    def _write_file(self, path: str, writer: SplitBinaryWriter) -> None:
        with open(path, "r", encoding="utf-8", newline=None) as handle:
            line_number = 1  # of the next line read
            if self.header:
                first = handle.readline()
                if not first:
                    raise TranscodeError(f"{path}: the file is empty; expected a header line (the chunk sets header: true)")
                names = [name.strip() for name in first.rstrip("\n").split(self.delimiter)]
                if names != self.features:
                    raise TranscodeError(
                        f"{path}, line 1: the header names {names} do not match the chunk's features {self.features}"
                    )
                line_number = 2
            while True:
                try:
                    lines = list(itertools.islice(handle, self.block_lines))
                except UnicodeDecodeError as error:
                    raise TranscodeError(f"{path}: not UTF-8 text (after line {line_number - 1}): {error}") from error
                if not lines:
                    return
                self._write_block(path, line_number, lines, writer)
                line_number += len(lines)

    def _write_block(self, path: str, first_line: int, lines: list[str], writer: SplitBinaryWriter) -> None:
        rows = [line[:-1].split(self.delimiter) if line.endswith("\n") else line.split(self.delimiter) for line in lines]
        widths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        wrong = np.flatnonzero(widths != len(self.features))
        if wrong.size:
            row = int(wrong[0])
            raise TranscodeError(
                f"{path}, line {first_line + row}: expected {len(self.features)} columns separated by "
                f"{self.delimiter!r} ({', '.join(self.features)}). Received {widths[row]}"
            )
        table = np.array(rows, dtype=str).reshape(len(rows), len(self.features))

        def parse(column: _Column) -> np.ndarray:
            values, row, reason = _parse_column(column, table[:, column.index])
            if values is None:
                raise TranscodeError(f"{path}, line {first_line + row}: {reason}")
            return values

        label = parse(self.label).astype(bool)
        numerical = np.stack([parse(c) for c in self.numerical], axis=1) if self.numerical else None
        categorical = [parse(c) for c in self.categorical]
        writer.append(label, numerical, categorical)


def _check_encode(spec: FeatureSpec, split: str, encode) -> dict:
    """The chunk's ``encode`` mapping, checked: each a categorical, dynamic, int64, one-hot feature."""
    where = f"{spec.source}: source_spec.{split}[0].encode"
    if not isinstance(encode, dict):
        raise TranscodeError(f"{where}: expected a mapping feature -> encoding. Received: {encode!r}")
    for feature, encoding in encode.items():
        if encoding not in ENCODINGS:
            raise TranscodeError(f"{where}.{feature}: expected one of {list(ENCODINGS)} (vocabulary encoding is not "
                                 f"implemented yet). Received: {encoding!r}")
        if feature not in spec.categorical_features:
            raise TranscodeError(f"{where}.{feature}: only categorical features are encoded. Received: {feature!r}")
        properties = spec.feature_spec[feature]
        if properties.get("dynamic") is not True or properties.get("dtype") != "int64" or spec.hotness(feature) != 1:
            raise TranscodeError(f"{where}.{feature}: a hashed feature holds raw int64 keys of a one-hot dynamic table; "
                                 f"declare it with dtype: int64 and dynamic: true (and a capacity). Received: {dict(properties)}")
    return dict(encode)


def transcode(input_spec_path: str, output_dir: str, block_lines: int = DEFAULT_BLOCK_LINES) -> FeatureSpec:
    """Converts every split of a csv FeatureSpec to split_binary under ``output_dir``.

    Args:
        input_spec_path: a FeatureSpec yaml whose splits are csv chunks (paths relative to the yaml).
        output_dir: where ``<split>/...bin`` and ``feature_spec.yaml`` are written.
        block_lines: lines parsed at a time (bounds memory).

    Returns:
        The written spec (categorical dtypes chosen by cardinality, label bool).

    Raises:
        FeatureSpecError: the input spec is invalid or names a missing file.
        TranscodeError: a csv file is invalid (message: file, 1-based line, column and reason).
    """
    if block_lines <= 0:
        raise ValueError(f"Expected block_lines > 0. Received: block_lines={block_lines}")
    spec = FeatureSpec.load(input_spec_path, check_files=True)
    if not spec.splits:
        raise TranscodeError(f"{input_spec_path}: source_spec lists no splits to transcode")
    transcoders = {split: _SplitTranscoder(spec, split, block_lines) for split in spec.splits}
    output_dir = os.path.abspath(output_dir)
    inputs = [input_spec_path] + [spec.resolve(f) for split in spec.splits for chunk in spec.chunks(split) for f in chunk["files"]]
    # Staged in a temporary sibling and published by one rename once every split is read without error.
    with staged_output(output_dir, "--output_dir", "tf_dlrm.data.transcode", inputs) as workspace:
        out_spec = with_split_binary_sources(spec, spec.splits, workspace)
        counts = {}
        for split, transcoder in transcoders.items():
            with SplitBinaryWriter(out_spec, split) as writer:
                counts[split] = transcoder.write(writer)
        out_spec.metadata.update({"transcoded_from": os.path.abspath(input_spec_path), "num_samples": counts})
        out_spec.save(os.path.join(workspace, "feature_spec.yaml"))
    out_spec.base_directory = output_dir
    out_spec.source = os.path.join(output_dir, "feature_spec.yaml")
    return out_spec


# ---------------------------------------------------------------------- command line


def _define_flags() -> None:
    # Defined only when run as a program, so importing this module never clashes with other flags.
    from absl import flags

    flags.DEFINE_string("input_spec", None, "FeatureSpec yaml with one csv chunk per split.")
    flags.DEFINE_string("output_dir", None, "Directory for the split_binary files and feature_spec.yaml.")
    flags.DEFINE_integer("block_lines", DEFAULT_BLOCK_LINES, "Lines parsed at a time (bounds memory).", lower_bound=1)
    flags.mark_flags_as_required(["input_spec", "output_dir"])


def main(argv: Sequence[str]) -> None:
    from absl import flags

    if len(argv) > 1:
        sys.exit(f"error: unexpected arguments {list(argv[1:])}")
    options = flags.FLAGS
    try:
        spec = transcode(options.input_spec, options.output_dir, block_lines=options.block_lines)
    except (ValueError, OSError) as error:  # TranscodeError and FeatureSpecError are ValueErrors
        sys.exit(f"error: {error}")
    counts: Any = spec.metadata["num_samples"]
    print(f"wrote {spec.source}: " + ", ".join(f"{split}={count} samples" for split, count in counts.items()))


def run() -> None:
    """Console script entry point ``tf-dlrm-transcode``."""
    from absl import app

    _define_flags()
    app.run(main)


if __name__ == "__main__":
    run()
