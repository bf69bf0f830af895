"""NVIDIA DLRM_and_DCNv2's ``split_tfrecords`` layout, read unchanged (``--dataset_type=split_tfrecords``).

Per split (``<dataset>/train/``, ``<dataset>/test/``, next to the feature spec): ``length.json`` (the
number of pre-batches), and one directory per input: ``label/``, ``numerical/``, ``categorical_<i>/``
(``i`` = position in the spec's categorical channel). Each holds ``format.json``
(``{"format": "tfrecords", "dtype", "multihot", "feature_name", "num_features", ...}``) and
``data_<k>.tfrecords`` files of ``tf.train.Example`` records, one pre-batch of ``P`` samples each: the
bytes feature ``feature_name`` is ``tf.io.serialize_tensor`` of a ``[P, num_features]`` tensor, or
for a multi-hot feature a serialized composite (a string tensor of the serialized ragged components:
ids, then int32 row splits).

Pre-batches are split into samples and batched again, so any global batch size works (not only
``P``); rank r keeps its local slice of labels, numerical and local features, and the global batch of
the features it owns. A last incomplete global batch is dropped, in training and evaluation alike.

Multi-hot features. NVIDIA's writer (``PrebatchStreamWriter`` with ``multihot = hotness > 1``) stores
every multi-hot feature as a ragged pre-batch, ``hotness`` being the most ids a sample may hold (their
synthetic generator draws 1 to ``hotness`` ids per row by default). A ``ragged`` feature
(:meth:`FeatureSpec.ragged`; :func:`ragged_by_default` makes every multi-hot feature of a spec read
from this layout ragged unless its entry says ``ragged: false``) is yielded as a ``tf.RaggedTensor``
``[batch, None]`` with 0 to ``hotness`` ids per sample; a longer row stops the run with one line naming
the directory, feature and sample. A feature with ``ragged: false`` must hold exactly ``hotness`` ids
per sample (the layer's fixed-hotness input, the faster path), or the run stops naming it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np
import tensorflow as tf

from tf_dlrm.io import files
from tf_dlrm.data.validation import MARKER
from tf_dlrm.spec.feature_spec import FeatureSpec
from tf_dlrm.data.reader import read_columns
from tf_dlrm.spec.format import NUMERICAL_CHANNEL, FeatureSpecError


def ragged_by_default(spec: FeatureSpec) -> FeatureSpec:
    """``spec`` with ``ragged: true`` on every multi-hot feature whose entry does not say: in NVIDIA's
    split_tfrecords layout ``hotness`` is the most ids a sample holds (rows are stored ragged)."""
    for name in spec.categorical_features:
        if spec.hotness(name) > 1 and "ragged" not in spec.feature_spec[name]:
            spec.feature_spec[name]["ragged"] = True
    return spec


def splits_of(spec: FeatureSpec) -> list[str]:
    """The splits of a dataset in this layout: the directories beside the spec holding a ``length.json`` (the
    spec's ``source_spec`` describes the binary files the records were written from, when it is there at all)."""
    base = spec.base_directory
    return sorted(name for name in files.listdir(base) if files.isfile(files.join(base, name, "length.json")))


def _read_json(path: str):
    try:
        with files.open_file(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise FeatureSpecError(f"split_tfrecords: missing {path}") from None
    except json.JSONDecodeError as error:
        raise FeatureSpecError(f"split_tfrecords: {path} is not valid JSON: {error}") from error


class _Input:
    """One input directory: its format and a dataset of its pre-batches."""

    def __init__(self, directory: str):
        self.directory = directory
        meta = _read_json(files.join(directory, "format.json"))
        if meta.get("format") != "tfrecords":
            raise FeatureSpecError(f"{directory}/format.json: expected format 'tfrecords'. Received: {meta.get('format')!r}")
        self.dtype = tf.as_dtype(meta["dtype"])
        self.multihot = bool(meta.get("multihot", False))
        self.feature_name = meta.get("feature_name", "data")
        self.num_features = int(meta.get("num_features", 1))
        # data_<k>.tfrecords in k order: the writer fills them in sequence.
        self.files = sorted(files.glob(files.join(directory, "data_*.tfrecords")),
                            key=lambda p: int(files.basename(p)[len("data_"):-len(".tfrecords")]))
        if not self.files:
            raise FeatureSpecError(f"split_tfrecords: no data_<k>.tfrecords files in {directory}")

    def parse(self, record):
        serialized = tf.io.parse_single_example(record, {self.feature_name: tf.io.FixedLenFeature([], tf.string)})[self.feature_name]
        if not self.multihot:
            return tf.reshape(tf.io.parse_tensor(serialized, self.dtype), [-1, self.num_features])
        parts = tf.io.parse_tensor(serialized, tf.string)
        values = tf.io.parse_tensor(parts[0], self.dtype)
        splits = tf.io.parse_tensor(parts[1], tf.int32)
        return tf.RaggedTensor.from_row_splits(values, splits, validate=False)

    def prebatches(self) -> tf.data.Dataset:
        return tf.data.TFRecordDataset(self.files).map(self.parse)


class SplitTFRecordsReader:
    """Reads one split of a ``split_tfrecords`` dataset as batches for one rank; the same interface
    and yield layout as :class:`tf_dlrm.data.reader.SplitBinaryReader`."""

    def __init__(self, spec: FeatureSpec, split: str, global_batch_size: int, rank: int = 0, world_size: int = 1,
                 input_modes: Mapping[str, str] | None = None):
        if global_batch_size <= 0 or global_batch_size % world_size:
            raise ValueError(f"Expected a positive global batch size that divides by world_size={world_size}. "
                             f"Received: global_batch_size={global_batch_size}")
        self.directory = files.join(spec.base_directory, split)
        self.global_batch_size, self.local_batch_size = global_batch_size, global_batch_size // world_size
        self.rank = rank
        names = spec.categorical_features
        self.global_categorical, self.local_categorical = read_columns(spec, input_modes)
        self.label = _Input(files.join(self.directory, "label"))
        self.numerical = _Input(files.join(self.directory, "numerical")) if spec.numerical_features else None
        self.categorical = {i: _Input(files.join(self.directory, f"categorical_{i}"))
                            for i in self.global_categorical + self.local_categorical}
        self.names = names
        self.split = split
        self.hotness = [spec.hotness(name) for name in names]
        self.ragged = [spec.ragged(name) for name in names]
        self.cardinalities = spec.cardinalities()
        prebatches = int(_read_json(files.join(self.directory, "length.json")))
        first = next(iter(self.label.prebatches().take(1)), None)
        if first is None:
            raise FeatureSpecError(f"split_tfrecords: {self.label.directory} holds no records")
        self.prebatch_size = int(first.shape[0])
        # The last pre-batch may be shorter (a writer's remainder): count its samples, or the loop would
        # wait for batches the data does not hold.
        last = next(iter(self.label.prebatches().skip(prebatches - 1).take(1)), None) if prebatches > 1 else first
        samples = (prebatches - 1) * self.prebatch_size + (int(last.shape[0]) if last is not None else 0)
        # Only whole global batches are read (the last partial one is dropped).
        self.num_samples = samples // global_batch_size * global_batch_size
        self.num_numerical = len(spec.numerical_features)

    @property
    def num_batches(self) -> int:
        return self.num_samples // self.global_batch_size

    def _length_check(self, index: int, prebatch, lengths, bad, what: str):
        """Asserts no row of a pre-batch is ``bad`` (a ``[P]`` mask over its ``lengths``), naming the first
        one by its sample in the split: pre-batch index times the pre-batch size, plus the row."""
        flags = tf.concat([bad, [True]], axis=0)  # a sentinel: the first bad row is P when none is
        row = tf.argmax(tf.cast(flags, tf.int32), output_type=tf.int64)
        count = tf.size(lengths, out_type=tf.int64)
        return tf.debugging.Assert(
            tf.equal(row, count),
            [f"{MARKER}split '{self.split}', feature '{self.names[index]}', directory {self.directory}/categorical_{index}: "
             "sample", tf.cast(prebatch, tf.int64) * count + row, "holds",
             tf.gather(tf.concat([tf.cast(lengths, tf.int64), [0]], axis=0), row), what])

    def _ragged(self, index: int, prebatch, ids):
        """A ragged feature's pre-batch as it was written, once no row holds more than ``hotness`` ids."""
        hotness = self.hotness[index]
        if not isinstance(ids, tf.RaggedTensor):  # written dense (NVIDIA writes hotness 1 so): every row full
            ids = tf.RaggedTensor.from_tensor(tf.reshape(ids, [tf.shape(ids)[0], -1]))
        lengths = ids.row_lengths()
        check = self._length_check(index, prebatch, lengths, lengths > tf.cast(hotness, lengths.dtype),
                                   f"ids, more than its hotness {hotness}")
        with tf.control_dependencies([check]):
            return ids.with_values(tf.identity(ids.values))

    def _checked_labels(self, prebatch, labels):
        """A label pre-batch once every value is 0 or 1 (NVIDIA writes int8 labels: 2 or 255 would train as
        a positive once cast)."""
        flat = tf.reshape(labels, [-1])
        bad = tf.concat([tf.logical_and(tf.not_equal(flat, 0), tf.not_equal(flat, 1)), [True]], axis=0)
        row = tf.argmax(tf.cast(bad, tf.int32), output_type=tf.int64)
        count = tf.size(flat, out_type=tf.int64)
        check = tf.debugging.Assert(
            tf.equal(row, count),
            [f"{MARKER}split '{self.split}', feature 'label', directory {self.label.directory}: sample",
             tf.cast(prebatch, tf.int64) * count + row, "has label",
             tf.gather(tf.concat([tf.cast(flat, tf.float32), [0.0]], axis=0), row), "(expected 0 or 1)"])
        with tf.control_dependencies([check]):
            return tf.identity(labels)

    def _fixed(self, index: int, prebatch, ids):
        """A multi-hot feature's ragged ids as the layer's ``[n, hotness]`` (every row full)."""
        hotness = self.hotness[index]
        if not isinstance(ids, tf.RaggedTensor):
            ids = tf.reshape(ids, [-1]) if hotness == 1 else tf.reshape(ids, [-1, hotness])
        else:
            lengths = ids.row_lengths()
            check = self._length_check(
                index, prebatch, lengths, tf.not_equal(lengths, tf.cast(hotness, lengths.dtype)),
                f"ids, not exactly its hotness {hotness} (a fixed-hotness feature: ragged: true allows 0 to {hotness})")
            with tf.control_dependencies([check]):
                ids = tf.reshape(tf.identity(ids.values), [-1] if hotness == 1 else [-1, hotness])
        return ids

    def dataset(self, epoch: int = 0, start_batch: int = 0) -> tf.data.Dataset:
        """The global batches in file order (no shuffle: the pre-batches are already mixed)."""
        order = list(self.global_categorical + self.local_categorical)
        out_types = [tf.int64 if self.cardinalities[i] > np.iinfo(np.int32).max else tf.int32 for i in order]
        inputs = [self.label.prebatches().enumerate().map(self._checked_labels)]
        inputs.append(self.numerical.prebatches() if self.numerical else self.label.prebatches().map(lambda l: tf.zeros([tf.shape(l)[0], 0])))
        # Fixed multi-hot pre-batches become dense [P, hotness] before they are cut into samples; ragged
        # ones stay ragged (a sample is then a [None] row, batched back into a RaggedTensor).
        for i, t in zip(order, out_types):
            shape = self._ragged if self.ragged[i] else self._fixed
            inputs.append(self.categorical[i].prebatches().enumerate().map(
                lambda prebatch, ids, i=i, t=t, shape=shape: tf.cast(shape(i, prebatch, ids), t)))
        samples = tf.data.Dataset.zip(tuple(inputs)).unbatch()
        batches = samples.batch(self.global_batch_size, drop_remainder=True).skip(start_batch)
        local = slice(self.rank * self.local_batch_size, (self.rank + 1) * self.local_batch_size)
        scopes = ["global"] * len(self.global_categorical) + ["local"] * len(self.local_categorical)
        names = self.names

        def split(label, numerical, *categorical):
            features = {names[i]: ids if scope == "global" else ids[local] for i, ids, scope in zip(order, categorical, scopes)}
            return ({NUMERICAL_CHANNEL: tf.cast(numerical[local], tf.float32), **features},
                    tf.reshape(tf.cast(label[local], tf.float32), [-1, 1]))

        return batches.map(split, num_parallel_calls=2, deterministic=True).prefetch(tf.data.AUTOTUNE)

    def close(self) -> None:
        pass
