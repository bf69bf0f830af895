"""NVIDIA DLRM_and_DCNv2's split_tfrecords layout, written here by an independent writer (tf.train
records of serialized pre-batches, multi-hot features as serialized ragged components), read back
at batch sizes that are not the pre-batch size, trained under -np 2, and bad rows named."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf
import yaml

from conftest import launch
from tf_dlrm.data.split_tfrecords import SplitTFRecordsReader
from tf_dlrm.spec.feature_spec import FeatureSpec

PREBATCH = 32
CARDINALITIES = [7, 300, 2500]
HOTNESS = [1, 3, 2]
NAMES = [f"cat_{i}.bin" for i in range(len(CARDINALITIES))]
# Rank 1 of 2 reads feature 1 for the global batch, features 0 and 2 for its local slice.
MODES = {NAMES[1]: "global", NAMES[0]: "local", NAMES[2]: "local"}


def write_input(directory, prebatches, dtype, multihot=False, num_features=1):
    """One input directory as NVIDIA's writer lays it out: format.json and data_<k>.tfrecords."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "format.json"), "w") as handle:
        json.dump({"format": "tfrecords", "dtype": dtype, "multihot": multihot, "feature_name": "data",
                   "num_features": num_features, "batches_per_file": 2}, handle)
    for start in range(0, len(prebatches), 2):
        with tf.io.TFRecordWriter(os.path.join(directory, f"data_{start // 2}.tfrecords")) as writer:
            for batch in prebatches[start:start + 2]:
                if multihot:
                    ragged = tf.RaggedTensor.from_row_lengths(batch[0].astype(np.int32), batch[1].astype(np.int32))
                    parts = [tf.io.serialize_tensor(t) for t in (ragged.values, ragged.row_splits)]
                    data = tf.io.serialize_tensor(tf.stack(parts)).numpy()
                else:
                    data = tf.io.serialize_tensor(tf.constant(batch, dtype)).numpy()
                example = tf.train.Example(features=tf.train.Features(
                    feature={"data": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data]))}))
                writer.write(example.SerializeToString())


def power_law_lengths(rng, count: int, hotness: int, alpha: float = 1.2) -> np.ndarray:
    """Row lengths as NVIDIA's synthetic generator draws them (``variable_hotness``): the inverse CDF of a
    power law on ``[1, hotness]`` applied to uniform draws, truncated to integers (mostly short rows)."""
    gamma = 1.0 - alpha
    low, high = 1.0, float(hotness) + 1.0  # + 1: let truncation reach hotness itself
    lengths = (rng.random(count) * (high ** gamma - low ** gamma) + low ** gamma) ** (1.0 / gamma)
    return np.minimum(lengths.astype(np.int32), hotness)


def write_dataset(root, num_prebatches=40, seed=0, bad_row=False, variable=False, too_long=None, bad_label=None,
                  fixed=()):
    """``variable``: multi-hot rows of 1 to hotness ids (power law), except the features of ``fixed``
    (full rows, ``ragged: false`` in the spec); ``too_long``: ``(feature, sample)`` given hotness + 1 ids;
    ``bad_label``: ``(sample, value)``."""
    rng = np.random.default_rng(seed)
    samples = num_prebatches * PREBATCH
    written = {}  # multi-hot feature -> ids of each sample
    numerical = rng.normal(size=(samples, 4)).astype(np.float16)
    ids = [rng.integers(0, c, (samples, h)) for c, h in zip(CARDINALITIES, HOTNESS)]
    # Labels the ids decide: a model that reads them learns.
    label = ((ids[0][:, 0] % 2 == 0) & (ids[1][:, 0] < 150)).astype(np.int8)[:, None]
    if bad_label is not None:
        label[bad_label[0], 0] = bad_label[1]
    for i, hotness in enumerate(HOTNESS):
        if hotness > 1:  # the same rows in both splits
            written[i] = power_law_lengths(rng, samples, hotness) if variable and i not in fixed else np.full(samples, hotness)
            if bad_row:
                written[i][5] = hotness - 1
            if too_long is not None and too_long[0] == i:
                ids[i] = np.concatenate([ids[i], ids[i][:, :1]], axis=1)
                written[i][too_long[1]] = hotness + 1
    for split in ("train", "test"):
        directory = os.path.join(root, split)
        chunks = lambda array: [array[k * PREBATCH:(k + 1) * PREBATCH] for k in range(num_prebatches)]  # noqa: E731
        write_input(os.path.join(directory, "label"), chunks(label), "int8")
        write_input(os.path.join(directory, "numerical"), chunks(numerical), "float16", num_features=4)
        for i, (values, hotness) in enumerate(zip(ids, HOTNESS)):
            if hotness == 1:
                write_input(os.path.join(directory, f"categorical_{i}"), chunks(values), "int32")
                continue
            lengths = written[i]
            flat = [v[:n] for v, n in zip(values, lengths)]
            batches = [(np.concatenate(flat[k * PREBATCH:(k + 1) * PREBATCH]), lengths[k * PREBATCH:(k + 1) * PREBATCH])
                       for k in range(num_prebatches)]
            write_input(os.path.join(directory, f"categorical_{i}"), batches, "int32", multihot=True)
        with open(os.path.join(directory, "length.json"), "w") as handle:
            json.dump(num_prebatches, handle)
    features = {"label": {"dtype": "bool"}, **{f"num_{j}": {"dtype": "float16"} for j in range(4)}}
    for i, (c, h) in enumerate(zip(CARDINALITIES, HOTNESS)):
        features[f"cat_{i}.bin"] = {"dtype": "int32", "cardinality": c, **({"hotness": h} if h > 1 else {}),
                                    **({"ragged": False} if i in fixed else {})}
    spec = {"feature_spec": features, "channel_spec": {"label": ["label"], "numerical": [f"num_{j}" for j in range(4)],
                                                       "categorical": [f"cat_{i}.bin" for i in range(3)]}}
    with open(os.path.join(root, "feature_spec.yaml"), "w") as handle:
        yaml.safe_dump(spec, handle)
    if variable:  # what each sample holds: its first `length` ids
        return numerical, [v if i not in written else [row[:n] for row, n in zip(v, written[i])]
                           for i, v in enumerate(ids)], label
    return numerical, ids, label


def test_reads_any_batch_size_with_each_ranks_slice(tmp_path):
    numerical, ids, label = write_dataset(str(tmp_path))
    spec = FeatureSpec.load(str(tmp_path / "feature_spec.yaml"), check_files=False)
    reader = SplitTFRecordsReader(spec, "train", 48, rank=1, world_size=2, input_modes=MODES)
    assert reader.num_batches == 40 * PREBATCH // 48
    batches = list(reader.dataset())
    assert len(batches) == reader.num_batches
    features, labels = batches[3]
    assert sorted(features) == sorted(["numerical", *NAMES])
    start = 3 * 48
    np.testing.assert_allclose(features["numerical"].numpy(), numerical[start + 24:start + 48].astype(np.float32))
    np.testing.assert_array_equal(features[NAMES[1]].numpy(), ids[1][start:start + 48])  # global: all 48 samples
    np.testing.assert_array_equal(features[NAMES[0]].numpy(), ids[0][start + 24:start + 48, 0])
    np.testing.assert_array_equal(features[NAMES[2]].numpy(), ids[2][start + 24:start + 48])
    np.testing.assert_array_equal(labels.numpy()[:, 0], label[start + 24:start + 48, 0])


def test_a_row_of_the_wrong_hotness_is_named(tmp_path):
    write_dataset(str(tmp_path), num_prebatches=2, bad_row=True)
    spec = FeatureSpec.load(str(tmp_path / "feature_spec.yaml"), check_files=False)
    reader = SplitTFRecordsReader(spec, "train", 32)
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        list(reader.dataset())
    from tf_dlrm.data.validation import message_of

    assert message_of(caught.value) == (
        f"split 'train', feature 'cat_1.bin', directory {tmp_path}/train/categorical_1: sample 5 holds 2 ids, "
        "not exactly its hotness 3 (a fixed-hotness feature: ragged: true allows 0 to 3)")


@pytest.mark.multirank
def test_trains_under_two_ranks(tmp_path):
    write_dataset(str(tmp_path), num_prebatches=60)
    log = tmp_path / "log.jsonl"
    launch(2, ["main.py", f"--dataset_path={tmp_path}", "--dataset_type=split_tfrecords", "--embedding_dim=8",
               "--bottom_mlp_dims=16,8", "--top_mlp_dims=16,1", "--batch_size=96", "--epochs=6", "--learning_rate=0.5", "--optimizer=sgd", "--embedding_optimizer=sgd",
               "--data_parallel_threshold=100", "--print_freq=1000", f"--log_path={log}"], timeout=600)
    final = json.loads(open(log).read().splitlines()[-1])
    assert final["world_size"] == 2 and final["steps"] == 6 * (60 * PREBATCH // 96)
    assert final["auc"] > 0.8, final  # the labels are a function of the ids (test split = train split)


def _rows(ragged: tf.RaggedTensor) -> list[list[int]]:
    return [list(row) for row in ragged.to_list()]


def test_variable_length_rows_load_as_ragged_ids(tmp_path):
    """Rows of 1 to hotness ids, as NVIDIA's generator draws them, come out as they were written."""
    from tf_dlrm.data.split_tfrecords import ragged_by_default

    numerical, ids, label = write_dataset(str(tmp_path), variable=True)
    lengths = np.array([len(row) for row in ids[1]])
    assert lengths.min() == 1 and lengths.max() == HOTNESS[1] and (lengths < HOTNESS[1]).mean() > 0.5
    spec = ragged_by_default(FeatureSpec.load(str(tmp_path / "feature_spec.yaml"), check_files=False))
    assert [spec.ragged(name) for name in spec.categorical_features] == [False, True, True]
    reader = SplitTFRecordsReader(spec, "train", 48, rank=1, world_size=2, input_modes=MODES)
    features, labels = list(reader.dataset())[3]
    start = 3 * 48
    assert isinstance(features[NAMES[1]], tf.RaggedTensor) and isinstance(features[NAMES[2]], tf.RaggedTensor)
    assert _rows(features[NAMES[1]]) == [list(row) for row in ids[1][start:start + 48]]  # global: all 48 samples
    np.testing.assert_array_equal(features[NAMES[0]].numpy(), ids[0][start + 24:start + 48, 0])
    assert _rows(features[NAMES[2]]) == [list(row) for row in ids[2][start + 24:start + 48]]
    np.testing.assert_array_equal(labels.numpy()[:, 0], label[start + 24:start + 48, 0])


def test_a_row_longer_than_hotness_is_named_with_its_sample(tmp_path):
    from tf_dlrm.data.split_tfrecords import ragged_by_default
    from tf_dlrm.data.validation import message_of

    write_dataset(str(tmp_path), num_prebatches=4, variable=True, too_long=(2, 70))
    spec = ragged_by_default(FeatureSpec.load(str(tmp_path / "feature_spec.yaml"), check_files=False))
    reader = SplitTFRecordsReader(spec, "train", 32)
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        list(reader.dataset())
    assert message_of(caught.value) == (
        f"split 'train', feature 'cat_2.bin', directory {tmp_path}/train/categorical_2: sample 70 holds 3 ids, "
        "more than its hotness 2")


TRAIN_FLAGS = ["--dataset_type=split_tfrecords", "--embedding_dim=8", "--bottom_mlp_dims=16,8", "--top_mlp_dims=16,1",
               "--batch_size=96", "--epochs=2", "--learning_rate=0.5", "--optimizer=sgd", "--embedding_optimizer=sgd",
               "--data_parallel_threshold=100", "--print_freq=1000"]


@pytest.mark.multirank
def test_nvidias_writer_logic_trains_column_wise_on_two_ranks_like_one_process(tmp_path):
    """A dataset written with NVIDIA's own writing logic (benchmarks/dle_split_tfrecords.py: their
    PrebatchStreamWriter's serialized ragged pre-batches, rows of 1 to hotness ids, power-law lengths)
    trains under -np 2 with the multi-hot tables split by columns, and ends with the weights of one
    process (the full-size run and its oracle AUC: benchmarks/results/multi_hot.md).

    Tolerance: both runs add the same float32 numbers in other orders (the allreduce, the pooled sums
    of column slices), a few units of 2**-24 (6e-8) per step on weights below 1; over 20 SGD steps
    that stays far below 1e-5, while a dropped, repeated or misplaced id moves its row by the
    learning rate times a gradient (1e-3 and more)."""
    import sys

    from conftest import run_python

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    from dle_split_tfrecords import TRAIN_FLAGS as DLE_FLAGS, checkpoint_weights, max_weight_difference, write_dataset

    spec = write_dataset(str(tmp_path / "data"), num_train_prebatches=40, num_valid_prebatches=10, prebatch_size=32)
    flags = [f"--dataset_path={tmp_path / 'data'}", *DLE_FLAGS, "--batch_size=128", "--epochs=2", "--learning_rate=1.0"]
    logs = {ranks: tmp_path / f"log{ranks}.jsonl" for ranks in (1, 2)}
    completed = launch(2, ["main.py", *flags, f"--log_path={logs[2]}", f"--save_checkpoint_path={tmp_path / 'ckpt2'}"],
                       timeout=600)
    # The plan line names each rank's column slices: the variable-length tables of 3500 and 5000 rows among them.
    output = completed.stdout + completed.stderr
    assert "t6[0:8]" in output and "t7[0:4]" in output, output[-3000:]
    run_python(["main.py", *flags, f"--log_path={logs[1]}", f"--save_checkpoint_path={tmp_path / 'ckpt1'}"], timeout=600)
    final = {ranks: json.loads(open(path).read().splitlines()[-1]) for ranks, path in logs.items()}
    assert final[2]["world_size"] == 2 and final[2]["steps"] == final[1]["steps"] == 2 * (40 * 32 // 128)
    assert abs(final[2]["auc"] - final[1]["auc"]) <= 1e-5, final
    difference = max_weight_difference(checkpoint_weights(str(tmp_path / "ckpt1")), checkpoint_weights(str(tmp_path / "ckpt2")))
    assert difference <= 1e-5, difference
    assert spec["feature_spec"]["cat_3.bin"]["hotness"] == 10 and 0.75 < spec["metadata"]["oracle_valid_auc"] < 0.95


def test_main_refuses_a_row_longer_than_hotness_in_one_line(tmp_path):
    from conftest import run_python

    write_dataset(str(tmp_path), num_prebatches=4, variable=True, too_long=(1, 100))
    completed = run_python(["main.py", f"--dataset_path={tmp_path}", *TRAIN_FLAGS, "--batch_size=32"], check=False,
                           timeout=300)
    assert completed.returncode == 2, completed.stderr[-3000:]
    assert "Traceback" not in completed.stderr, completed.stderr[-3000:]
    assert (f"error (rank 0): split 'train', feature 'cat_1.bin', directory {tmp_path}/train/categorical_1: "
            "sample 100 holds 4 ids, more than its hotness 3\n") in completed.stderr, completed.stderr[-3000:]


@pytest.mark.parametrize("value", [2, -1])  # -1: the byte 255 of NVIDIA's int8 labels
def test_a_label_other_than_0_or_1_is_named_with_its_sample(tmp_path, value):
    from tf_dlrm.data.validation import message_of

    write_dataset(str(tmp_path), num_prebatches=4, bad_label=(77, value))
    reader = SplitTFRecordsReader(FeatureSpec.load(str(tmp_path / "feature_spec.yaml"), check_files=False), "test", 32)
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        list(reader.dataset())
    assert message_of(caught.value) == (
        f"split 'test', feature 'label', directory {tmp_path}/test/label: sample 77 has label {value} (expected 0 or 1)")
