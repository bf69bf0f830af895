"""CSV or Parquet -> split_binary: converts a "bring your own dataset" FeatureSpec with csv or parquet chunks.

The input spec names, for every split, exactly one chunk of ``type: csv`` whose ``features`` are the
file's columns in order (columns of features no channel uses are skipped) and whose ``files`` are
read one after the other, or of ``type: parquet`` (below)::

    source_spec:
      train:
        - type: csv
          features: [label, num_0, num_1, cat_0, cat_1]
          files: [train_part0.csv, train_part1.csv]
          header: true        # optional, default false: the first line of each file names the columns
          delimiter: ","      # optional, default ","
          encode: {cat_0: vocabulary, cat_1: hash}     # optional: raw categorical values
          transform: {num_0: log1p, num_1: {clip: [0, 100]}}   # optional: numerical transforms

Cells are plain values (no quoting): labels 0 or 1, numerical values finite numbers, categorical ids
integers in ``[0, cardinality)`` unless the column is encoded. A multi-hot feature (``hotness: h``)
holds exactly ``h`` ids per cell separated by ``|``, e.g. ``12|7|99`` for ``hotness: 3``; with
``ragged: true`` 0 to ``h`` (an empty cell holds none), written with a lengths file
(:mod:`tf_dlrm.data.ragged_split_binary`). A weighted ragged feature (``weighted: true``) takes its weights
from another column of the chunk, named by the chunk key ``weights: {feature: column}`` (the column declared
in ``feature_spec`` as ``{dtype: float32}`` and read by no channel): one number per id, separated by ``|``
(``0.5|1|2`` beside ``12|7|99``; a list column in Parquet); a row whose count of weights differs from its
count of ids is an error naming the file, line (row) and column. The output has a weights file beside the
lengths file.

Raw values (:mod:`tf_dlrm.data.csv_declarations` has the syntax): ``encode: hash`` turns each stripped
cell into the int64 key ``blake2b(feature name + NUL + cell, 8 bytes)`` (little-endian, signed) of a
dynamic table (``dynamic: true``, ``dtype: int64``); ``encode: vocabulary`` numbers the values by
descending frequency over the train split (:mod:`tf_dlrm.data.csv_vocabulary`: ``min_count``, the OOV
id), writes ``vocabularies/<feature>.tsv`` next to the data and sets the feature's cardinality in the
written spec. ``transform`` applies ``log1p`` and ``clip`` to numerical values
(:mod:`tf_dlrm.data.csv_values`). An empty cell is a value like any other for an encoded column.

Parquet (``type: parquet``, as pandas, Spark or NVTabular write it): ``features`` name the columns to
read (by name, in any order; other columns are ignored), ``files`` are read one after the other in
blocks of rows across row groups, and ``encode``/``transform`` are as for csv (``header`` and
``delimiter`` are csv's only). Each value is read as the csv cell holding it
(:mod:`tf_dlrm.data.parquet_cells`): a null is an empty cell, a list column holds a multi-hot
feature (exactly ``hotness`` ids per row, 0 to ``hotness`` with ``ragged: true``), so the same data as csv or as Parquet transcodes to the
same bytes. Errors name the file, column and row (0-based). Needs ``pyarrow``.

Engines: ``--engine=local`` (this process) or ``--engine=spark`` (:mod:`tf_dlrm.data.transcode_spark`;
Parquet one task per row group); both call the same per-block functions and write the same bytes.

Output: NVIDIA's per-split split_binary layout under ``output_dir`` and ``output_dir/feature_spec.yaml``
written last. Files are parsed in blocks of lines with numpy; a block that fails is rescanned cell by
cell only to name the first bad file, line and column. The output is staged in a temporary sibling
and published by a rename (:mod:`tf_dlrm.io.publish`): on any error nothing is published and a
dataset already in ``output_dir`` is left as it was; a directory holding other files, or the input
itself (transcoding in place), is refused.

Usage::

    python -m tf_dlrm.data.transcode --input_spec=my_data/feature_spec.yaml --output_dir=my_data/binary [--engine=spark]
    python -m tf_dlrm.data.transcode --input_spec=... --output_dir=... --test_fraction=0.1

The second divides the ``train`` split's rows in row order into train, ``validation`` and ``test``
(:mod:`tf_dlrm.data.fractions`; local engine), counting vocabularies over the rows left in train. On the command
line ``--valid_fraction`` defaults to ``--test_fraction``: a held-out test split comes with a validation split to
choose by (``--valid_fraction=0``: train and test only).
"""

from __future__ import annotations

if __name__ == "__main__":  # before the imports below: a stop signal while they run counts (tf_dlrm/io/early_stop.py)
    from tf_dlrm.io.early_stop import stop_while_starting

    stop_while_starting("tf_dlrm.data.transcode")

import dataclasses
import itertools
import os
import sys
from typing import Any, Iterator, Sequence

import numpy as np

from tf_dlrm.data.csv_declarations import HASH, Declarations, read_declarations, transform_entry, vocabulary_features_of_raw
from tf_dlrm.data.csv_values import (CATEGORICAL, HASHED, LABEL, NUMERICAL, VOCABULARY, WEIGHTS, Column, CsvLayout, TranscodeError,
                                     count_block, count_table, parse_block, parse_cells)
from tf_dlrm.data.csv_vocabulary import Vocabulary, build_vocabulary
from tf_dlrm.data.fractions import TEST, check_fractions, command_line_valid_fraction, fraction_ranges
from tf_dlrm.data.layout import categorical_file_name, with_split_binary_sources
from tf_dlrm.data.split_binary import SplitBinaryWriter
from tf_dlrm.spec.format import CSV, PARQUET, TRAIN_SPLIT
from tf_dlrm.spec.feature_spec import FeatureSpec, read_spec_yaml
from tf_dlrm.io.publish import staged_output

DEFAULT_BLOCK_LINES = 1 << 16
BOM = "\ufeff"
ENGINES = ("local", "spark")
VOCABULARY_DIRECTORY = "vocabularies"


@dataclasses.dataclass(frozen=True)
class CsvSource:
    """One split's csv files and how they are read."""

    split: str
    paths: tuple[str, ...]
    features: tuple[str, ...]
    header: bool
    delimiter: str
    # Data lines [first, end) over the files read in order (--valid_fraction, --test_fraction); None: all.
    rows: tuple[int, int] | None = None
    weights: tuple[tuple[str, str], ...] = ()  # (weighted feature, its weights column) of the chunk's `weights`

    def check_header(self, path: str, first: str | None) -> None:
        """The first line of ``path`` (no newline; None for an empty file) must name the chunk's features."""
        if first is None:
            raise TranscodeError(f"{path}: the file is empty; expected a header line (the chunk sets header: true)")
        # A byte-order mark (what spreadsheet programs write before UTF-8 text) is no part of the first name.
        names = [name.strip() for name in first.removeprefix(BOM).split(self.delimiter)]
        if names != list(self.features):
            raise TranscodeError(f"{path}, line 1: the header names {names} do not match the chunk's features {list(self.features)}")


@dataclasses.dataclass(frozen=True)
class ParquetSource:
    """One split's Parquet files; ``features`` are column names."""

    split: str
    paths: tuple[str, ...]
    features: tuple[str, ...]
    weights: tuple[tuple[str, str], ...] = ()  # as CsvSource's


class LocalEngine:
    """Reads the csv (or Parquet) files in this process, in blocks of ``block_lines`` lines (rows)."""

    reads_parquet = True

    def __init__(self, block_lines: int = DEFAULT_BLOCK_LINES):
        if block_lines <= 0:
            raise ValueError(f"Expected block_lines > 0. Received: block_lines={block_lines}")
        self.block_lines = block_lines

    def count(self, source: CsvSource | ParquetSource, layout: CsvLayout, features: Sequence[str]) -> dict[str, dict[str, int]]:
        counts: dict[str, dict[str, int]] = {feature: {} for feature in features}
        if isinstance(source, ParquetSource):
            for _, _, table in self._parquet_blocks(source, layout):
                count_table(layout, features, table, counts)
            return counts
        for path, first_line, lines in self._blocks(source):
            count_block(layout, features, path, first_line, lines, counts)
        return counts

    def write(self, source: CsvSource | ParquetSource, layout: CsvLayout, writer: SplitBinaryWriter) -> None:
        if isinstance(source, ParquetSource):
            for path, first_row, table in self._parquet_blocks(source, layout):
                writer.append(*parse_cells(layout, table, lambda row: f"{path}, row {first_row + row}"))
            return
        for path, first_line, lines in self._blocks(source):
            writer.append(*parse_block(layout, path, first_line, lines))

    def count_rows(self, source: CsvSource) -> int:
        """Data lines (after any header) of the source's files, as :meth:`_blocks` reads them."""
        return sum(len(lines) for _, _, lines in self._blocks(dataclasses.replace(source, rows=None)))

    def _parquet_blocks(self, source: ParquetSource, layout: CsvLayout) -> Iterator[tuple[str, int, np.ndarray]]:
        from tf_dlrm.data import parquet_cells

        used = (layout.label, *layout.numerical, *layout.categorical, *layout.weights)
        for path in source.paths:
            for first_row, table in parquet_cells.blocks(path, source.features, used, self.block_lines):
                yield path, first_row, table

    def _blocks(self, source: CsvSource) -> Iterator[tuple[str, int, list[str]]]:
        if source.rows is None:
            yield from self._file_blocks(source)
            return
        first, end = source.rows
        seen = 0  # data lines before the block
        for path, line_number, lines in self._file_blocks(source):
            begin, stop = max(first - seen, 0), min(end - seen, len(lines))
            if begin < stop:
                yield path, line_number + begin, lines[begin:stop]
            seen += len(lines)
            if seen >= end:
                return

    def _file_blocks(self, source: CsvSource) -> Iterator[tuple[str, int, list[str]]]:
        for path in source.paths:
            # utf-8-sig: a byte-order mark at the start of the file (spreadsheet programs write one) is dropped.
            with open(path, "r", encoding="utf-8-sig", newline=None) as handle:
                line_number = 1  # of the next line read
                try:
                    if source.header:
                        first = handle.readline()
                        source.check_header(path, first.rstrip("\n") if first else None)
                        line_number = 2
                    while True:
                        lines = list(itertools.islice(handle, self.block_lines))
                        if not lines:
                            break
                        yield path, line_number, [line[:-1] if line.endswith("\n") else line for line in lines]
                        line_number += len(lines)
                except UnicodeDecodeError as error:
                    raise TranscodeError(f"{path}: not UTF-8 text (after line {line_number - 1}): {error}") from error


def _load_spec(input_spec_path: str) -> tuple[FeatureSpec, set[str]]:
    """The input spec; a feature encoded by vocabulary takes its cardinality (and dtype) from the vocabulary."""
    raw = read_spec_yaml(input_spec_path)
    by_vocabulary = vocabulary_features_of_raw(raw)
    for feature in sorted(by_vocabulary):
        properties = raw.get("feature_spec", {}).get(feature) if isinstance(raw.get("feature_spec"), dict) else None
        if not isinstance(properties, dict):
            continue  # the spec's own validation names the problem
        if "cardinality" in properties:
            raise TranscodeError(f"{input_spec_path}: feature_spec.{feature}.cardinality: a feature with encode: vocabulary "
                                 f"gets its cardinality from the vocabulary; remove it. Received: {properties['cardinality']!r}")
        properties.setdefault("dtype", "int64")
        properties["cardinality"] = 1  # placeholder for validation; replaced once the vocabulary is counted
    spec = FeatureSpec.from_dict(raw, base_directory=os.path.dirname(os.path.abspath(input_spec_path)),
                                 source=input_spec_path, check_files=True)
    return spec, by_vocabulary


def _source(spec: FeatureSpec, split: str) -> tuple[CsvSource | ParquetSource, Declarations]:
    chunks = spec.chunks(split)
    if len(chunks) != 1 or chunks[0]["type"] not in (CSV, PARQUET):
        types = [chunk["type"] for chunk in chunks]
        raise TranscodeError(
            f"{spec.source}: source_spec.{split}: expected exactly one chunk of type 'csv' or 'parquet' holding all "
            f"features of the split. Received {len(chunks)} chunk(s) of type(s) {types}"
        )
    chunk = chunks[0]
    if chunk["type"] == PARQUET:
        for key in ("header", "delimiter"):
            if key in chunk:
                raise TranscodeError(f"{spec.source}: source_spec.{split}[0].{key}: a csv key; a parquet chunk finds its "
                                     f"columns by name. Received: {key}: {chunk[key]!r}")
        paths = tuple(spec.resolve(relative) for relative in chunk["files"])
        weights = tuple(chunk.get("weights", {}).items())
        return ParquetSource(split, paths, tuple(chunk["features"]), weights), read_declarations(spec, split, chunk)
    header, delimiter = chunk.get("header", False), chunk.get("delimiter", ",")
    if not isinstance(header, bool):
        raise TranscodeError(f"{spec.source}: source_spec.{split}[0].header: expected true or false. Received: {header!r}")
    if not isinstance(delimiter, str) or not delimiter or "\n" in delimiter:
        raise TranscodeError(f"{spec.source}: source_spec.{split}[0].delimiter: expected a non-empty string. Received: {delimiter!r}")
    paths = tuple(spec.resolve(relative) for relative in chunk["files"])
    return (CsvSource(split, paths, tuple(chunk["features"]), header, delimiter, weights=tuple(chunk.get("weights", {}).items())),
            read_declarations(spec, split, chunk))


def _no_rows(source: CsvSource | ParquetSource) -> str:
    """The message for a split that would be written without a sample (nothing could train or evaluate on it)."""
    where = ", ".join(source.paths)
    if getattr(source, "rows", None) is not None:
        what = f"its fraction of the data rows of {where} is empty (rows {source.rows[0]} to {source.rows[1]})"
    elif getattr(source, "header", False):
        what = f"{where} hold{'s' if len(source.paths) == 1 else ''} only a header line, no data rows"
    else:
        what = f"{where} hold{'s' if len(source.paths) == 1 else ''} no data rows"
    return f"split '{source.split}': {what}. Expected at least one sample. Received: {source.split}=0 samples"


def _same_declarations(spec: FeatureSpec, declarations: dict[str, Declarations]) -> Declarations:
    """The declarations every split shares (compared with the train split's, where the vocabulary comes from)."""
    first = TRAIN_SPLIT if TRAIN_SPLIT in declarations else next(iter(declarations))
    reference = declarations[first]
    for split in declarations:
        for name in ("encode", "transform"):
            if getattr(declarations[split], name) != getattr(reference, name):
                raise TranscodeError(
                    f"{spec.source}: source_spec.{split}[0].{name} differs from source_spec.{first}[0].{name}: every split "
                    f"must declare the same encodings and transforms. Received: {spec.chunks(split)[0].get(name)!r} "
                    f"vs {spec.chunks(first)[0].get(name)!r}"
                )
    return reference


def _variable_length(spec: FeatureSpec, feature: str) -> bool:
    """A multi-hot feature with ``ragged: true``: cells of 0 to hotness ids, written with a lengths file."""
    return spec.ragged(feature) and spec.hotness(feature) > 1


def _layout(spec: FeatureSpec, source: CsvSource | ParquetSource, declarations: Declarations,
            vocabularies: dict[str, Vocabulary | None]) -> CsvLayout:
    position = {feature: index for index, feature in enumerate(source.features)}
    by_name = isinstance(source, ParquetSource)
    numerical = tuple(Column(f, position[f], NUMERICAL, spec.dtype(f), transforms=declarations.transform.get(f, ()), by_name=by_name)
                      for f in spec.numerical_features)
    categorical = []
    for f in spec.categorical_features:
        encoding = declarations.encode.get(f)
        if encoding == HASH:
            categorical.append(Column(f, position[f], HASHED, np.dtype(np.int64), by_name=by_name))
        elif encoding is not None:
            categorical.append(Column(f, position[f], VOCABULARY, np.dtype(np.int64), vocabulary=vocabularies[f], by_name=by_name))
        else:
            categorical.append(Column(f, position[f], CATEGORICAL, spec.dtype(f), int(spec.feature_spec[f]["cardinality"]),
                                      spec.hotness(f), ragged=_variable_length(spec, f), by_name=by_name))
    label = Column(spec.label_feature, position[spec.label_feature], LABEL, np.dtype(np.float64), by_name=by_name)
    # A weighted feature's weights: the column the chunk's `weights: {feature: column}` names.
    weights = tuple(Column(column, position[column], WEIGHTS, np.dtype(np.float32), hotness=spec.hotness(feature),
                           ragged=True, by_name=by_name, weights_of=feature)
                    for feature, column in source.weights)
    return CsvLayout(source.features, getattr(source, "delimiter", ","), label, numerical, tuple(categorical), weights)


def _by_fraction(input_spec_path: str, spec: FeatureSpec, sources: dict[str, CsvSource], engine, valid_fraction: float,
                 test_fraction: float) -> dict[str, CsvSource]:
    """The sources with the train split's rows divided into train, validation and test."""
    check_fractions(test_fraction, valid_fraction)
    if TRAIN_SPLIT not in sources:
        raise TranscodeError(f"{input_spec_path}: --valid_fraction and --test_fraction divide the '{TRAIN_SPLIT}' split, "
                             f"which source_spec lacks. Received splits: {spec.splits}")
    if not hasattr(engine, "count_rows"):
        raise TranscodeError("--valid_fraction and --test_fraction need --engine=local (the Spark engine reads whole splits)")
    if isinstance(sources[TRAIN_SPLIT], ParquetSource):
        raise TranscodeError(f"{input_spec_path}: --valid_fraction and --test_fraction divide csv rows; the "
                             f"'{TRAIN_SPLIT}' split is Parquet: give its splits as separate files instead")
    # A test split only when asked for (fraction_ranges always names one, as preprocessing.criteo writes).
    ranges = [r for r in fraction_ranges(engine.count_rows(sources[TRAIN_SPLIT]), test_fraction, valid_fraction)
              if r[0] != TEST or test_fraction]
    clashes = sorted({name for name, _, _ in ranges if name != TRAIN_SPLIT} & set(sources))
    if clashes:
        raise TranscodeError(f"{input_spec_path}: source_spec already has the split(s) {clashes} that --valid_fraction and "
                             f"--test_fraction write; remove them or the flags")
    divided = {name: dataclasses.replace(sources[TRAIN_SPLIT], split=name, rows=(first, end)) for name, first, end in ranges}
    return divided | {name: source for name, source in sources.items() if name != TRAIN_SPLIT}


def vocabulary_file_name(feature: str, index: int) -> str:
    return f"{VOCABULARY_DIRECTORY}/{categorical_file_name(feature, index)[:-len('.bin')]}.tsv"


def transcode(input_spec_path: str, output_dir: str, block_lines: int = DEFAULT_BLOCK_LINES, engine=None,
              valid_fraction: float = 0.0, test_fraction: float = 0.0) -> FeatureSpec:
    """Converts every split of a csv FeatureSpec to split_binary under ``output_dir``.

    With ``valid_fraction`` or ``test_fraction`` > 0, the ``train`` split's rows are divided in row
    order (:mod:`tf_dlrm.data.fractions`): train, then ``validation``, then ``test``; vocabularies
    count the rows left in train only. The input spec must not name those splits already.

    Args:
        input_spec_path: a FeatureSpec yaml whose splits are csv or parquet chunks (paths relative to the yaml).
        output_dir: where ``<split>/...bin``, ``vocabularies/*.tsv`` and ``feature_spec.yaml`` are written.
        block_lines: lines (Parquet: rows) parsed at a time by the local engine (bounds memory).
        engine: ``LocalEngine`` (default, with ``block_lines``) or a ``transcode_spark.SparkEngine``; both write
            the same bytes.

    Returns:
        The written spec (categorical dtypes chosen by cardinality, label bool).

    Raises:
        FeatureSpecError: the input spec is invalid or names a missing file.
        TranscodeError: a declaration or an input file is invalid (message: file, 1-based line or 0-based row,
            column and reason).
    """
    engine = engine if engine is not None else LocalEngine(block_lines)
    spec, _ = _load_spec(input_spec_path)
    if not spec.splits:
        raise TranscodeError(f"{input_spec_path}: source_spec lists no splits to transcode")
    sources, declared = {}, {}
    for split in spec.splits:
        sources[split], declared[split] = _source(spec, split)
        if isinstance(sources[split], ParquetSource) and not getattr(engine, "reads_parquet", False):
            raise TranscodeError(f"{input_spec_path}: source_spec.{split} is a parquet chunk, which the "
                                 f"{type(engine).__name__} does not read; transcode it with --engine=local")
    declarations = _same_declarations(spec, declared)
    if valid_fraction or test_fraction:
        sources = _by_fraction(input_spec_path, spec, sources, engine, valid_fraction, test_fraction)
    splits = list(sources)
    options = declarations.vocabulary_features()
    vocabularies: dict[str, Vocabulary | None] = {}
    if options:
        if TRAIN_SPLIT not in sources:
            raise TranscodeError(f"{input_spec_path}: encode: vocabulary counts values over the '{TRAIN_SPLIT}' split, "
                                 f"which source_spec lacks. Received splits: {spec.splits}")
        features = [f for f in spec.categorical_features if f in options]
        counting_layout = _layout(spec, sources[TRAIN_SPLIT], declarations, {f: None for f in features})
        counts = engine.count(sources[TRAIN_SPLIT], counting_layout, features)
        for index, feature in enumerate(spec.categorical_features):
            if feature in options:
                vocabulary = vocabularies[feature] = build_vocabulary(feature, counts[feature], options[feature])
                spec.feature_spec[feature].update({"cardinality": vocabulary.cardinality, "oov_id": vocabulary.oov_id,
                                                   "vocabulary": vocabulary_file_name(feature, index)})
    for feature, encoding in declarations.encode.items():
        spec.feature_spec[feature]["encoded"] = HASH if encoding == HASH else "vocabulary"
    for feature, steps in declarations.transform.items():
        spec.feature_spec[feature]["transform"] = transform_entry(steps)
    layouts = {split: _layout(spec, sources[split], declarations, vocabularies) for split in splits}
    output_dir = os.path.abspath(output_dir)
    inputs = [input_spec_path] + sorted({path for source in sources.values() for path in source.paths})
    # Staged in a temporary sibling and published by one rename once every split is read without error.
    with staged_output(output_dir, "--output_dir", "tf_dlrm.data.transcode", inputs) as workspace:
        # Variable-length multi-hot features get a lengths file (tf_dlrm.data.ragged_split_binary).
        out_spec = with_split_binary_sources(spec, splits, workspace,
                                             [f for f in spec.categorical_features if _variable_length(spec, f)],
                                             [f for f in spec.categorical_features if spec.weighted(f)])
        for feature, vocabulary in vocabularies.items():
            path = os.path.join(workspace, spec.feature_spec[feature]["vocabulary"])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8", newline="\n") as handle:
                handle.write(vocabulary.to_text())
        counts = {}
        for split in splits:
            with SplitBinaryWriter(out_spec, split) as writer:
                engine.write(sources[split], layouts[split], writer)
                counts[split] = writer.num_samples
            if not counts[split]:
                raise TranscodeError(_no_rows(sources[split]))
        out_spec.metadata.update({"transcoded_from": os.path.abspath(input_spec_path), "num_samples": counts})
        if valid_fraction or test_fraction:
            out_spec.metadata["split"] = {"rule": "fraction", "valid_fraction": valid_fraction, "test_fraction": test_fraction}
        out_spec.save(os.path.join(workspace, "feature_spec.yaml"))
    out_spec.base_directory = output_dir
    out_spec.source = os.path.join(output_dir, "feature_spec.yaml")
    return out_spec


# ---------------------------------------------------------------------- command line


def _define_flags() -> None:
    # Defined only when run as a program, so importing this module never clashes with other flags.
    from absl import flags

    flags.DEFINE_string("input_spec", None, "FeatureSpec yaml with one csv or parquet chunk per split.")
    flags.DEFINE_string("output_dir", None, "Directory for the split_binary files and feature_spec.yaml.")
    flags.DEFINE_integer("block_lines", DEFAULT_BLOCK_LINES, "Lines (Parquet: rows) parsed at a time (bounds memory).",
                         lower_bound=1)
    flags.DEFINE_enum("engine", "local", list(ENGINES), "local: this process; spark: PySpark (same bytes).")
    flags.DEFINE_string("spark_master", "local[*]", "Spark master URL (--engine=spark).")
    flags.DEFINE_float("valid_fraction", None, "Divide the train split in row order: this share of its rows, just "
                       "before the test rows, becomes a 'validation' split, the one training chooses by (default: as "
                       "--test_fraction; 0: none).")
    flags.DEFINE_float("test_fraction", 0.0, "Divide the train split in row order: its last rows, this share, become "
                       "a 'test' split (0: none).")
    flags.mark_flags_as_required(["input_spec", "output_dir"])


def main(argv: Sequence[str]) -> None:
    from absl import flags

    if len(argv) > 1:
        sys.exit(f"error: unexpected arguments {list(argv[1:])}")
    options = flags.FLAGS
    engine = None
    try:
        if options.engine == "spark":
            from tf_dlrm.data.transcode_spark import SparkEngine

            engine = SparkEngine(master=options.spark_master)
        spec = transcode(options.input_spec, options.output_dir, block_lines=options.block_lines, engine=engine,
                         valid_fraction=command_line_valid_fraction(options.valid_fraction, options.test_fraction),
                         test_fraction=options.test_fraction)
    except (ValueError, OSError, ImportError, RuntimeError) as error:  # TranscodeError, FeatureSpecError: ValueErrors
        sys.exit(f"error: {error}")
    finally:
        if engine is not None:
            # After a failure or a stop signal the Spark gateway may be cut in the middle of a call.
            engine.close(failed=sys.exc_info()[0] is not None)
    counts: Any = spec.metadata["num_samples"]
    print(f"wrote {spec.source}: " + ", ".join(f"{split}={count} samples" for split, count in counts.items()))
    for feature in spec.categorical_features:
        properties = spec.feature_spec[feature]
        if "vocabulary" in properties:
            print(f"  {feature}: vocabulary of {properties['cardinality'] - 1} values + OOV id {properties['oov_id']} "
                  f"({properties['vocabulary']})")


def run() -> None:
    """Console script entry point ``tf-dlrm-transcode``."""
    from absl import app

    from tf_dlrm.io.stop_signals import stopping_cleanly

    _define_flags()
    with stopping_cleanly("tf_dlrm.data.transcode"):
        app.run(main)


if __name__ == "__main__":
    run()
