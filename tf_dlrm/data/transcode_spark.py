"""The Spark engine of the transcoder: the same blocks functions as the local engine, on executors.

Spark reads each csv file (``textFile``, bytes, one or more partitions per file), the driver counts
lines per partition so every line keeps its file and line number, and the executors split blocks of
lines into cells as :func:`tf_dlrm.data.csv_values.count_block` and ``parse_block`` do and call
:func:`~tf_dlrm.data.csv_values.count_table` (the vocabulary pass, reduced by value across the
cluster; the driver numbers the values with the same :func:`build_vocabulary` as the local engine)
and :func:`~tf_dlrm.data.csv_values.parse_cells` (the write pass) on them. Every row's
values depend on that row alone, so both engines write the same bytes (tested byte for byte).

Executors save each partition's arrays under ``<split output>/_spark_parts``; the driver appends them
in partition order through the same ``SplitBinaryWriter`` as the local engine and removes them. On a
cluster the output directory must be on a filesystem the executors and the driver share. A bad cell
stops the job with the message of the first partition (in file order) that holds one.

Parquet chunks: the driver lists each file's row groups (and checks its schema), one task per row
group reads it with pyarrow (:func:`tf_dlrm.data.parquet_cells.blocks`; executors need pyarrow) and
the same :func:`~tf_dlrm.data.csv_values.count_table` / :func:`~tf_dlrm.data.csv_values.parse_cells`
run on its cells, rows numbered from the file's start.

This module imports no TensorFlow and no FeatureSpec: executors import only it, ``csv_values``,
``csv_vocabulary`` and ``parquet_cells`` (shipped with ``addPyFile``).
"""

from __future__ import annotations

import functools
import operator
import os
import shutil
import tempfile
from typing import Iterable, Sequence

import numpy as np

from tf_dlrm.data import parquet_cells
from tf_dlrm.data.csv_values import CsvLayout, TranscodeError, count_table, parse_cells, split_lines

DEFAULT_BLOCK_LINES = 1 << 16
_ERROR = "error"


INSTALL = "`make install-spark` (pip extra `tf_dlrm[spark]`)"


def make_session(master: str = "local[*]", conf: dict | None = None):
    """A SparkSession whose Python workers use this interpreter (:func:`tf_dlrm.data.spark_session.start_session`)."""
    from tf_dlrm.data import spark_session  # driver only: executors import this module without it

    spark_session.require_pyspark(INSTALL)
    return spark_session.start_session(master, "tf_dlrm_transcode", conf)


# ----------------------------------------------------------------------------- executor functions


def _line_count(_, lines: Iterable[bytes]):
    yield sum(1 for _ in lines)


def _blocks(partition: int, lines: Iterable[bytes], layout, paths, header: bool, block_lines: int):
    """``(path, first line number, decoded lines)`` of a partition; a file's header line is skipped."""
    file_index, first_index = layout[partition]
    path = paths[file_index]
    number = first_index + 1  # 1-based line number of the next line
    batch, start = [], None
    for line in lines:
        if header and number == 1:
            number += 1
            continue
        try:
            text = line.decode("utf-8-sig" if number == 1 else "utf-8")  # a byte-order mark starts no value
        except UnicodeDecodeError as error:
            raise TranscodeError(f"{path}: not UTF-8 text (line {number}): {error}") from error
        if start is None:
            start = number
        batch.append(text)
        number += 1
        if len(batch) >= block_lines:
            yield path, start, batch
            batch, start = [], None
    if batch:
        yield path, start, batch


def _csv_tables(partition: int, lines: Iterable[bytes], layout, paths, header: bool, block_lines: int, csv_layout):
    """``(where(row), [rows, columns] cells)`` of a partition of csv lines."""
    for path, first_line, block in _blocks(partition, lines, layout, paths, header, block_lines):
        yield (lambda row, p=path, f=first_line: f"{p}, line {f + row}"), split_lines(csv_layout, path, first_line, block)


def _parquet_tables(partition: int, tasks: Iterable[tuple], features, block_lines: int, csv_layout):
    """``(where(row), cells)`` of a partition's Parquet row groups ``(path, row group, its first row in the file)``."""
    used = (csv_layout.label, *csv_layout.numerical, *csv_layout.categorical)
    for path, group, first_row in tasks:
        for offset, table in parquet_cells.blocks(path, features, used, block_lines, row_groups=[group]):
            yield (lambda row, p=path, f=first_row + offset: f"{p}, row {f + row}"), table


def _count_partition(partition, items, tables, csv_layout, features):
    counts: dict[str, dict[str, int]] = {feature: {} for feature in features}
    try:
        for _, table in tables(partition, items):
            count_table(csv_layout, features, table, counts)
    except TranscodeError as error:
        yield (_ERROR, partition), str(error)
        return
    for feature, values in counts.items():
        for value, count in values.items():
            yield (feature, value), count


def _write_partition(partition, items, tables, csv_layout, parts_dir):
    from pyspark import TaskContext

    context = TaskContext.get()
    attempt = context.attemptNumber() if context is not None else 0
    part = os.path.join(parts_dir, f"{partition:06d}-{attempt}.npy")
    rows = 0
    try:
        with open(part, "wb") as handle:
            for where, table in tables(partition, items):
                label, numerical, categorical = parse_cells(csv_layout, table, where)
                # A weighted feature is three arrays (ids, lengths, weights): saved one after another.
                for entry in [label, numerical] + list(categorical):
                    for array in (entry if isinstance(entry, tuple) else (entry,)):
                        if array is not None:
                            np.save(handle, array, allow_pickle=False)
                rows += label.shape[0]
    except TranscodeError as error:
        yield partition, None, 0, str(error)
        return
    yield partition, part, rows, None


# ----------------------------------------------------------------------------- the engine


class SparkEngine:
    """Transcodes with PySpark; ``transcode(..., engine=SparkEngine(...))``.

    Args:
        spark: an existing SparkSession (kept open), or None to start one on ``master`` (stopped by :meth:`close`).
        master: the Spark master URL, ``local[*]`` by default.
        min_partitions: passed to ``textFile`` (a gzip file is one partition).
        block_lines: executors parse a partition in blocks of this many lines.
    """

    def __init__(self, spark=None, master: str = "local[*]", min_partitions: int | None = None,
                 block_lines: int = DEFAULT_BLOCK_LINES):
        from tf_dlrm.data import spark_session

        spark_session.require_pyspark(INSTALL)
        if block_lines <= 0:
            raise ValueError(f"Expected block_lines > 0. Received: block_lines={block_lines}")
        self._owns_session = spark is None
        self.spark = spark if spark is not None else make_session(master)
        self.context = self.spark.sparkContext
        self.min_partitions = min_partitions
        self.block_lines = block_lines
        _ship_modules(self.context)

    def close(self, failed: bool = False) -> None:
        """Stops the session this engine started; after a failure or a stop signal by ending its JVM
        (:func:`tf_dlrm.data.spark_session.end_session`)."""
        if self._owns_session:
            from tf_dlrm.data import spark_session

            spark_session.end_session(self.spark, failed)

    reads_parquet = True

    def _partitions(self, source, layout: CsvLayout):
        """The RDD of a split and the function turning one of its partitions into blocks of cells."""
        if not hasattr(source, "header"):  # a parquet chunk: one partition per row group
            tasks = self._row_groups(source, layout)
            rdd = self.context.parallelize(tasks, max(1, len(tasks)))
            return rdd, functools.partial(_parquet_tables, features=list(source.features), block_lines=self.block_lines,
                                          csv_layout=layout)
        union, partitions = self._read(source)
        return union, functools.partial(_csv_tables, layout=partitions, paths=list(source.paths), header=source.header,
                                        block_lines=self.block_lines, csv_layout=layout)

    @staticmethod
    def _row_groups(source, layout: CsvLayout) -> list[tuple[str, int, int]]:
        """``(path, row group, its first row)`` of every file, in order; schemas checked here, before any task."""
        pa = parquet_cells.require_pyarrow()
        import pyarrow.parquet as pq

        used = (layout.label, *layout.numerical, *layout.categorical)
        tasks = []
        for path in source.paths:
            try:
                handle = pq.ParquetFile(os.path.abspath(path))
            except (pa.ArrowException, OSError) as error:
                raise TranscodeError(f"{path}: not a readable Parquet file: {error}") from error
            with handle:
                parquet_cells.check_schema(path, handle.schema_arrow, used)
                first = 0
                for group in range(handle.metadata.num_row_groups):
                    tasks.append((path, group, first))
                    first += handle.metadata.row_group(group).num_rows
        return tasks

    def _read(self, source):
        """The union RDD of the split's files, and ``(file index, first line index)`` per partition."""
        rdds = []
        for path in source.paths:
            rdd = self.context.textFile(os.path.abspath(path), self.min_partitions, use_unicode=False)
            if source.header:
                first = rdd.take(1)
                try:
                    source.check_header(path, first[0].decode("utf-8-sig") if first else None)
                except UnicodeDecodeError as error:
                    raise TranscodeError(f"{path}: not UTF-8 text (line 1): {error}") from error
            rdds.append(rdd)
        union = self.context.union(rdds)
        counts = union.mapPartitionsWithIndex(_line_count).collect()
        layout, partition = [], 0
        for index, rdd in enumerate(rdds):
            line = 0
            for _ in range(rdd.getNumPartitions()):
                layout.append((index, line))
                line += counts[partition]
                partition += 1
        return union, layout

    def count(self, source, layout: CsvLayout, features: Sequence[str]) -> dict[str, dict[str, int]]:
        union, tables = self._partitions(source, layout)
        counting = functools.partial(_count_partition, tables=tables, csv_layout=layout, features=list(features))
        reduced = union.mapPartitionsWithIndex(counting).reduceByKey(operator.add).collect()
        errors = sorted((key[1], message) for key, message in reduced if key[0] == _ERROR)
        if errors:
            raise TranscodeError(errors[0][1])
        counts: dict[str, dict[str, int]] = {feature: {} for feature in features}
        for (feature, value), count in reduced:
            counts[feature][value] = count
        return counts

    def write(self, source, layout: CsvLayout, writer) -> None:
        union, tables = self._partitions(source, layout)
        parts_dir = tempfile.mkdtemp(prefix="_spark_parts_", dir=os.path.dirname(os.path.abspath(writer.paths[0])))
        try:
            writing = functools.partial(_write_partition, tables=tables, csv_layout=layout, parts_dir=parts_dir)
            results = sorted(union.mapPartitionsWithIndex(writing).collect(), key=lambda result: result[0])
            errors = [message for _, _, _, message in results if message is not None]
            if errors:
                raise TranscodeError(errors[0])
            weighted = {column.weights_of for column in layout.weights}
            for _, part, rows, _ in results:
                with open(part, "rb") as handle:
                    read = 0
                    while read < rows:
                        load = lambda: np.load(handle, allow_pickle=False)  # noqa: E731
                        label = load()
                        numerical = load() if layout.numerical else None
                        categorical = [tuple(load() for _ in range(3)) if column.feature in weighted else load()
                                       for column in layout.categorical]
                        writer.append(label, numerical, categorical)
                        read += label.shape[0]
        finally:
            shutil.rmtree(parts_dir, ignore_errors=True)


def _ship_modules(context) -> None:
    """Ships the modules executors import, once per SparkContext."""
    from tf_dlrm.data import spark_session

    if getattr(context, "_tf_dlrm_transcode_shipped", False):
        return
    data = os.path.dirname(os.path.abspath(__file__))
    package = os.path.dirname(data)
    if os.path.getsize(os.path.join(package, "__init__.py")) or os.path.getsize(os.path.join(data, "__init__.py")):
        raise RuntimeError("tf_dlrm/__init__.py and tf_dlrm/data/__init__.py must stay empty: executors get empty copies")
    entries: dict[str, str | bytes] = {"tf_dlrm/__init__.py": b"", "tf_dlrm/data/__init__.py": b""}
    for name in ("csv_values.py", "csv_vocabulary.py", "parquet_cells.py", "transcode_spark.py"):
        entries[f"tf_dlrm/data/{name}"] = os.path.join(data, name)
    spark_session.ship_zip(context, "tf_dlrm_transcode.zip", entries)
    context._tf_dlrm_transcode_shipped = True
