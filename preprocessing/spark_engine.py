"""The Spark engine: the same passes as the local engine, distributed with PySpark.

Spark reads the inputs (``textFile``, gzip by extension, one partition per gzip file), counts lines
per partition so every row keeps its file and line number, reduces the frequency counts by key
bucket across the cluster, broadcasts the vocabulary, and transforms every partition on the
executors. Parsing and the transform are the numpy functions of :mod:`preprocessing.criteo_format`
and :mod:`preprocessing.vocabulary`, called on blocks of lines exactly as the local engine calls
them: this is what makes both engines' outputs identical byte for byte.

Executors write each partition's finished arrays under ``<output temp dir>/_spark_parts``; the
driver then appends them to the split_binary files in partition order. On a cluster the output
directory must therefore be on a filesystem every executor and the driver see (e.g. NFS), and
every executor needs Python with numpy; this package's code is shipped with ``addPyFile``.
"""

from __future__ import annotations

import functools
import os
import shutil
from typing import Callable, Iterable, Sequence

import numpy as np

from preprocessing.bad_rows import BadRowTally, merge_tallies, strict_error
from preprocessing.criteo_format import NUM_CATEGORICAL, NUM_INTEGER, detect_format, parse_block
from preprocessing.input_blocks import DETECT_LINES, check_compression
from preprocessing.local_engine import transform_blocks
from preprocessing.splits import TRAIN, InputFile, SplitPlan
from preprocessing.vocabulary import CountTable, Vocabulary

_SUMMARY = -1  # reduce key of the per-partition summaries in the count pass


INSTALL = "`make install-spark` or `TF_DLRM_EXTRAS=test,spark bash scripts/install.sh` (pip extra `tf_dlrm[spark]`)"


def make_session(master: str = "local[*]", app_name: str = "tf_dlrm_preprocess_criteo", conf: dict | None = None):
    """A SparkSession whose Python workers use this interpreter (:func:`tf_dlrm.data.spark_session.start_session`)."""
    from tf_dlrm.data import spark_session  # driver only: executors import this module without it

    spark_session.require_pyspark(INSTALL)
    return spark_session.start_session(master, app_name, conf)


def _is_local(path: str) -> bool:
    return "://" not in path


# ----------------------------------------------------------------------------- executor functions


def _line_count(_, lines: Iterable[bytes]):
    yield sum(1 for _ in lines)


def _blocks(partition: int, lines: Iterable[bytes], layout, formats, block_bytes: int):
    """``(file index, first data line, block bytes)`` of a partition, cut every ``block_bytes``."""
    file_index, first_line = layout[partition]
    header = formats[file_index].header
    physical = first_line
    batch, size = [], 0
    for line in lines:
        if header and physical == 0:
            physical = 1
            continue
        batch.append(line)
        size += len(line) + 1
        if size >= block_bytes:
            yield file_index, physical - int(header), b"\n".join(batch) + b"\n"
            physical += len(batch)
            batch, size = [], 0
    if batch:
        yield file_index, physical - int(header), b"\n".join(batch) + b"\n"


def _count_partition(partition, lines, layout, formats, block_bytes, plan, strict, num_buckets):
    tables, rows, tally = [], 0, BadRowTally()
    train = plan.names.index(TRAIN)
    for file_index, first_data_line, data in _blocks(partition, lines, layout, formats, block_bytes):
        if not plan.overlaps(file_index, first_data_line, data.count(b"\n"), TRAIN):
            continue
        parsed = parse_block(data, formats[file_index])
        in_train = plan.split_of(file_index, first_data_line, parsed.num_lines) == train
        if strict:
            tally.add_block(parsed, file_index, first_data_line + (2 if formats[file_index].header else 1), rows=in_train)
        chosen = in_train[parsed.valid]
        rows += int(chosen.sum())
        tables.append(CountTable.from_values(parsed.categorical[chosen]))
    table = CountTable.merge(tables)
    for bucket in range(num_buckets):
        yield bucket, table.bucket(bucket, num_buckets)
    yield _SUMMARY, (rows, tally)


def _merge_counts(left, right):
    if isinstance(left, CountTable):
        return CountTable.merge([left, right])
    return left[0] + right[0], merge_tallies([left[1], right[1]])


def _keep_frequent(item, frequency_threshold):
    key, value = item
    return (key, value.kept(frequency_threshold)) if key != _SUMMARY else item


def _transform_partition(partition, lines, layout, formats, block_bytes, plan, vocabulary, dtypes, parts_dir):
    from pyspark import TaskContext

    context = TaskContext.get()
    attempt = context.attemptNumber() if context is not None else 0
    directory = os.path.join(parts_dir, f"{partition:06d}-{attempt}")
    shutil.rmtree(directory, ignore_errors=True)
    streams: dict[str, list] = {}
    rows = {name: 0 for name in plan.names}
    tally = BadRowTally()
    try:
        for file_index, first_data_line, data in _blocks(partition, lines, layout, formats, block_bytes):
            parsed = parse_block(data, formats[file_index])
            tally.add_block(parsed, file_index, first_data_line + (2 if formats[file_index].header else 1))
            arrays = transform_blocks([(parsed, file_index, first_data_line)], plan, vocabulary.value, dtypes)
            for code, (label, numerical, ids) in arrays.items():
                name = plan.names[code]
                if name not in streams:
                    os.makedirs(os.path.join(directory, name), exist_ok=True)
                    streams[name] = [open(os.path.join(directory, name, f), "wb") for f in _part_files()]
                for stream, array in zip(streams[name], [label, numerical] + list(ids)):
                    stream.write(np.ascontiguousarray(array).tobytes())
                rows[name] += label.shape[0]
    finally:
        for files in streams.values():
            for stream in files:
                stream.close()
    yield partition, directory, rows, tally


def _part_files() -> list[str]:
    return ["label.bin", "numerical.bin"] + [f"cat_{i}.bin" for i in range(NUM_CATEGORICAL)]


# ----------------------------------------------------------------------------- the engine


class SparkEngine:
    """Preprocesses with PySpark.

    Args:
        spark: an existing SparkSession (kept open), or None to start one on ``master`` (stopped by
            :meth:`close`).
        master: the Spark master URL, ``local[*]`` by default.
        min_partitions: passed to ``textFile`` (plain files only; a gzip file is one partition).
        block_bytes: executors parse a partition in blocks of about this many bytes.
    """

    def __init__(
        self, spark=None, master: str = "local[*]", min_partitions: int | None = None, block_bytes: int = 4 << 20
    ):
        from tf_dlrm.data import spark_session

        spark_session.require_pyspark(INSTALL)
        self._owns_session = spark is None
        self.spark = spark if spark is not None else make_session(master)
        self.context = self.spark.sparkContext
        self.min_partitions = min_partitions
        self.block_bytes = block_bytes
        self._rdd = None
        self._layout: list[tuple[int, int]] = []
        _ship_package(self.context)

    def close(self, failed: bool = False) -> None:
        """Stops the session this engine started; after a failure or a stop signal by ending its JVM
        (:func:`tf_dlrm.data.spark_session.end_session`)."""
        if self._owns_session:
            from tf_dlrm.data import spark_session

            spark_session.end_session(self.spark, failed)

    def describe(self, paths: Sequence[str]) -> list[InputFile]:
        """Detects formats (from the first lines Spark reads) and counts lines per partition."""
        rdds, formats = [], []
        for path in paths:
            compressed = path.endswith(".gz")
            if _is_local(path):
                check_compression(path, compressed)
            location = os.path.abspath(path) if _is_local(path) else path
            rdd = self.context.textFile(location, self.min_partitions, use_unicode=False)
            formats.append(detect_format(path, rdd.take(DETECT_LINES)))
            rdds.append(rdd)
        self._formats = tuple(formats)
        self._rdd = self.context.union(rdds)
        counts = self._rdd.mapPartitionsWithIndex(_line_count).collect()
        self._layout, files, partition = [], [], 0
        for index, (path, rdd, input_format) in enumerate(zip(paths, rdds, formats)):
            line = 0
            for _ in range(rdd.getNumPartitions()):
                self._layout.append((index, line))
                line += counts[partition]
                partition += 1
            files.append(InputFile(index, path, path.endswith(".gz"), input_format, line - int(input_format.header and line > 0)))
        return files

    def count(
        self, files: Sequence[InputFile], plan: SplitPlan, strict: bool, frequency_threshold: int
    ) -> tuple[CountTable, int]:
        """Pass 1: counts reduced by key bucket on the cluster; only kept values reach the driver.

        Returns ``(counts of the values counted at least frequency_threshold times, training rows)``.
        """
        buckets = max(1, self.context.defaultParallelism)
        counting = functools.partial(
            _count_partition, layout=self._layout, formats=self._formats, block_bytes=self.block_bytes,
            plan=plan, strict=strict, num_buckets=buckets,
        )
        reduced = (
            self._rdd.mapPartitionsWithIndex(counting)
            .reduceByKey(_merge_counts, numPartitions=buckets)
            .map(functools.partial(_keep_frequent, frequency_threshold=frequency_threshold))
            .collect()
        )
        tables = [value for key, value in reduced if key != _SUMMARY]
        summaries = [value for key, value in reduced if key == _SUMMARY]
        rows = sum(s[0] for s in summaries)
        tally = merge_tallies(s[1] for s in summaries)
        if strict and tally.total:
            raise strict_error(tally.earliest(), [f.path for f in files])
        return CountTable.merge(tables), rows

    def transform(
        self,
        files: Sequence[InputFile],
        plan: SplitPlan,
        vocabulary: Vocabulary,
        dtypes,
        sink: Callable,
        strict: bool,
        workspace: str,
    ) -> BadRowTally:
        """Pass 2 on the executors; the driver appends the partitions' parts in order via ``sink``."""
        parts_dir = os.path.join(os.path.abspath(workspace), "_spark_parts")
        os.makedirs(parts_dir, exist_ok=True)
        broadcast = self.context.broadcast(vocabulary)
        transforming = functools.partial(
            _transform_partition,
            layout=self._layout,
            formats=self._formats,
            block_bytes=self.block_bytes,
            plan=plan,
            vocabulary=broadcast,
            dtypes=list(dtypes),
            parts_dir=parts_dir,
        )
        results = sorted(self._rdd.mapPartitionsWithIndex(transforming).collect(), key=lambda r: r[0])
        # Not in a ``finally``: after a stop signal cut the collect short, a py4j call would wait on the connection
        # that call left with an unread answer; the JVM is ended then anyway (spark_session.end_session).
        broadcast.unpersist()
        tally = merge_tallies(r[3] for r in results)
        paths = [f.path for f in files]
        if strict and tally.total:
            raise strict_error(tally.earliest(), paths)
        for _, directory, rows, _ in results:
            for name in plan.names:
                if not rows[name]:
                    continue
                base = os.path.join(directory, name)
                label = np.fromfile(os.path.join(base, "label.bin"), dtype=np.uint8)
                numerical = np.fromfile(os.path.join(base, "numerical.bin"), dtype=np.float16).reshape(-1, NUM_INTEGER)
                ids = [np.fromfile(os.path.join(base, f"cat_{i}.bin"), dtype=dtype) for i, dtype in enumerate(dtypes)]
                sink(name, label, numerical, ids)
            shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(parts_dir, ignore_errors=True)
        return tally


def _ship_package(context) -> None:
    """Ships this package's code to the executors, once per SparkContext."""
    from tf_dlrm.data import spark_session

    if getattr(context, "_tf_dlrm_preprocessing_shipped", False):
        return
    package = os.path.dirname(os.path.abspath(__file__))
    spark_session.ship_zip(context, "tf_dlrm_preprocessing.zip", {
        os.path.join("preprocessing", name): os.path.join(package, name)
        for name in sorted(os.listdir(package)) if name.endswith(".py")})
    context._tf_dlrm_preprocessing_shipped = True
