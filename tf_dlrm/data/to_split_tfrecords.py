"""``python -m tf_dlrm.data.to_split_tfrecords``: a split_binary dataset in NVIDIA's split_tfrecords layout.

    python -m tf_dlrm.data.to_split_tfrecords --dataset_path=DIR --output_dir=OUT [--prebatch_size=512]
        [--prebatches_per_file=64]

So datasets move both ways between tf_dlrm and NVIDIA DLRM_and_DCNv2 (which reads this layout and
whose own ``transcribe.py`` writes it; tf_dlrm reads it with ``--dataset_type=split_tfrecords``,
:mod:`tf_dlrm.data.split_tfrecords`). Per split: ``OUT/<split>/length.json`` (pre-batch count) and
one directory per input, ``label/``, ``numerical/``, ``categorical_<i>/`` (``i``: the position in the
categorical channel), each with ``format.json`` and ``data_<k>.tfrecords``: one ``tf.train.Example``
per pre-batch of ``--prebatch_size`` samples (the last may be shorter), whose bytes feature ``data``
is ``tf.io.serialize_tensor`` of the pre-batch as NVIDIA's ``PrebatchStreamWriter`` writes it:

- label: int8 ``[P, 1]``; numerical: float16 ``[P, n]``; a one-hot feature: int32 ``[P, 1]``;
- a multi-hot feature: ragged, as ``serialize_tensor(stack([serialize_tensor(values), serialize_tensor(row_splits)]))``
  with int32 values and row splits (``hotness`` ids a row, or each row's own count for a variable-length
  feature stored with a lengths file, :mod:`tf_dlrm.data.ragged_split_binary`).

``OUT/feature_spec.yaml`` is the input spec without its ``source_spec`` (NVIDIA's reader finds the
files by this layout, not by the spec). Ids must fit int32, as NVIDIA's layout stores them; a larger
id is refused naming the feature. The output is staged and published whole (:mod:`tf_dlrm.io.publish`).
"""

from __future__ import annotations

if __name__ == "__main__":  # before the imports below: a stop signal while they run counts (tf_dlrm/io/early_stop.py)
    from tf_dlrm.io.early_stop import stop_while_starting

    stop_while_starting("tf_dlrm.data.to_split_tfrecords")

import copy
import json
import os
import sys

import numpy as np

from tf_dlrm.spec.feature_spec import FeatureSpec

WRITER = "tf_dlrm.data.to_split_tfrecords"
INT32_MAX = np.iinfo(np.int32).max


def _serialized(tf, array, dtype: str, hotness: int = 1) -> bytes:
    """``array``: a pre-batch; for a variable-length feature a pair ``(ids, lengths)``."""
    if isinstance(array, tuple):
        values = np.asarray(array[0]).astype(np.int32)
        row_splits = np.concatenate([[0], np.cumsum(array[1], dtype=np.int64)]).astype(np.int32)
        parts = [tf.io.serialize_tensor(tf.constant(values)), tf.io.serialize_tensor(tf.constant(row_splits))]
        return tf.io.serialize_tensor(tf.stack(parts)).numpy()
    if hotness > 1:
        values = array.reshape(-1).astype(np.int32)
        row_splits = np.arange(0, values.size + 1, hotness, dtype=np.int32)
        parts = [tf.io.serialize_tensor(tf.constant(values)), tf.io.serialize_tensor(tf.constant(row_splits))]
        return tf.io.serialize_tensor(tf.stack(parts)).numpy()
    return tf.io.serialize_tensor(tf.constant(array.astype(dtype))).numpy()


class _VariableRows:
    """A split_binary variable-length feature (lengths file beside its ids) read by pre-batch, in order."""

    def __init__(self, ids_path: str, lengths_path: str, dtype, hotness: int, count: int):
        from tf_dlrm.spec.format import lengths_dtype_for

        self.lengths = np.fromfile(lengths_path, lengths_dtype_for(hotness)).astype(np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)])
        self.ids = np.memmap(ids_path, dtype=dtype, mode="r") if self.offsets[-1] else np.zeros(0, dtype)
        self.max = int(self.ids.max()) if self.ids.size else 0
        if self.lengths.size != count or self.ids.size != self.offsets[-1] or self.lengths.max(initial=0) > hotness:
            raise ValueError(f"{lengths_path}: expected {count} lengths of 0 to {hotness} adding up to the {self.ids.size} "
                             f"ids of {ids_path}")

    def rows(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(self.ids[self.offsets[start]:self.offsets[end]]), self.lengths[start:end]


class _InputWriter:
    """One input directory: format.json and data_<k>.tfrecords, ``per_file`` pre-batches a file."""

    def __init__(self, directory: str, dtype: str, num_features: int, multihot: bool, per_file: int):
        import tensorflow as tf

        self._tf, self.directory, self.per_file = tf, directory, per_file
        os.makedirs(directory)
        with open(os.path.join(directory, "format.json"), "w", encoding="utf-8") as handle:
            json.dump({"format": "tfrecords", "dtype": dtype, "multihot": multihot, "feature_name": "data",
                       "num_features": num_features, "batches_per_file": per_file}, handle)
        self.dtype, self.count, self._writer = dtype, 0, None

    def write(self, data: bytes) -> None:
        tf = self._tf
        if self.count % self.per_file == 0:
            self.close()
            self._writer = tf.io.TFRecordWriter(os.path.join(self.directory, f"data_{self.count // self.per_file}.tfrecords"))
        example = tf.train.Example(features=tf.train.Features(
            feature={"data": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data]))}))
        self._writer.write(example.SerializeToString())
        self.count += 1

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def convert_split(spec: FeatureSpec, split: str, directory: str, prebatch_size: int, per_file: int) -> int:
    """Writes one split into ``directory``; returns its pre-batch count."""
    import tensorflow as tf

    files = spec.split_files(split)
    count = files.num_samples
    names = spec.categorical_features
    label = np.memmap(files.label, dtype=np.uint8, mode="r") if count else np.zeros(0, np.uint8)
    numerical = (np.memmap(files.numerical, dtype=spec.dtype(spec.numerical_features[0]), mode="r").reshape(count, -1)
                 if files.numerical and count else np.zeros((count, len(spec.numerical_features)), np.float16))
    categorical = [_VariableRows(files.categorical[i], files.lengths_of(i), spec.dtype(name), spec.hotness(name), count)
                   if files.lengths_of(i) else
                   np.memmap(files.categorical[i], dtype=spec.dtype(name), mode="r").reshape(count, -1) if count
                   else np.zeros((0, spec.hotness(name)), spec.dtype(name)) for i, name in enumerate(names)]
    for name, ids in zip(names, categorical):
        if isinstance(ids, _VariableRows):
            if ids.max > INT32_MAX:
                raise ValueError(f"split '{split}', feature '{name}': ids up to {ids.max} do not fit NVIDIA's int32 layout")
            continue
        if ids.size and int(ids.max()) > INT32_MAX:
            raise ValueError(f"split '{split}', feature '{name}': ids up to {int(ids.max())} do not fit NVIDIA's int32 "
                             "layout")
    writers = [_InputWriter(os.path.join(directory, "label"), "int8", 1, False, per_file)]
    if spec.numerical_features:
        writers.append(_InputWriter(os.path.join(directory, "numerical"), "float16", len(spec.numerical_features), False,
                                    per_file))
    writers += [_InputWriter(os.path.join(directory, f"categorical_{i}"), "int32", 1, spec.hotness(name) > 1, per_file)
                for i, name in enumerate(names)]
    prebatches = 0
    try:
        for start in range(0, count, prebatch_size):
            end = min(count, start + prebatch_size)
            data = [_serialized(tf, np.asarray(label[start:end]).reshape(-1, 1), "int8")]
            if spec.numerical_features:
                data.append(_serialized(tf, np.asarray(numerical[start:end]), "float16"))
            data += [_serialized(tf, ids.rows(start, end) if isinstance(ids, _VariableRows)
                                 else np.asarray(ids[start:end]).reshape(end - start, -1), "int32", spec.hotness(name))
                     for name, ids in zip(names, categorical)]
            for writer, payload in zip(writers, data):
                writer.write(payload)
            prebatches += 1
    finally:
        for writer in writers:
            writer.close()
    with open(os.path.join(directory, "length.json"), "w", encoding="utf-8") as handle:
        json.dump(prebatches, handle)
    return prebatches


def convert(dataset_path: str, output_dir: str, prebatch_size: int = 512, prebatches_per_file: int = 64,
            feature_spec: str = "feature_spec.yaml") -> dict:
    """Writes every split of the split_binary dataset at ``dataset_path`` into ``output_dir``; returns
    ``{split: pre-batches}``."""
    from tf_dlrm.io.publish import staged_output

    if prebatch_size < 1 or prebatches_per_file < 1:
        raise ValueError(f"Expected --prebatch_size and --prebatches_per_file >= 1. Received: {prebatch_size}, "
                         f"{prebatches_per_file}")
    spec_path = feature_spec if os.path.isabs(feature_spec) else os.path.join(dataset_path, feature_spec)
    spec = FeatureSpec.load(spec_path)
    written = {}
    with staged_output(output_dir, "--output_dir", WRITER, [spec_path, dataset_path]) as workspace:
        for split in spec.splits:
            written[split] = convert_split(spec, split, os.path.join(workspace, split), prebatch_size, prebatches_per_file)
        copied = FeatureSpec(copy.deepcopy(spec.feature_spec), spec.channel_spec, {},
                             {**spec.metadata, "converted_by": WRITER, "prebatch_size": prebatch_size})
        copied.save(os.path.join(workspace, "feature_spec.yaml"))
    return written


def main(argv: list[str] | None = None) -> int:
    import argparse

    from tf_dlrm.io.stop_signals import stopping_cleanly

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset_path", required=True, help="a split_binary dataset (feature_spec.yaml and its files)")
    parser.add_argument("--feature_spec", default="feature_spec.yaml")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--prebatch_size", type=int, default=512)
    parser.add_argument("--prebatches_per_file", type=int, default=64)
    args = parser.parse_args(argv)
    with stopping_cleanly(WRITER):
        try:
            written = convert(args.dataset_path, args.output_dir, args.prebatch_size, args.prebatches_per_file, args.feature_spec)
        except (ValueError, OSError) as error:
            print(f"{WRITER}: error: {error}", file=sys.stderr)
            return 2
    print(f"wrote {args.output_dir}: " + ", ".join(f"{split}={count} pre-batches" for split, count in written.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
