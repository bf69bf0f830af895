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


def write_dataset(root, num_prebatches=40, seed=0, bad_row=False):
    rng = np.random.default_rng(seed)
    samples = num_prebatches * PREBATCH
    numerical = rng.normal(size=(samples, 4)).astype(np.float16)
    ids = [rng.integers(0, c, (samples, h)) for c, h in zip(CARDINALITIES, HOTNESS)]
    # Labels the ids decide: a model that reads them learns.
    label = ((ids[0][:, 0] % 2 == 0) & (ids[1][:, 0] < 150)).astype(np.int8)[:, None]
    for split in ("train", "test"):
        directory = os.path.join(root, split)
        chunks = lambda array: [array[k * PREBATCH:(k + 1) * PREBATCH] for k in range(num_prebatches)]  # noqa: E731
        write_input(os.path.join(directory, "label"), chunks(label), "int8")
        write_input(os.path.join(directory, "numerical"), chunks(numerical), "float16", num_features=4)
        for i, (values, hotness) in enumerate(zip(ids, HOTNESS)):
            if hotness == 1:
                write_input(os.path.join(directory, f"categorical_{i}"), chunks(values), "int32")
                continue
            lengths = np.full(samples, hotness)
            if bad_row:
                lengths[5] = hotness - 1
            flat = [v[:n] for v, n in zip(values, lengths)]
            batches = [(np.concatenate(flat[k * PREBATCH:(k + 1) * PREBATCH]), lengths[k * PREBATCH:(k + 1) * PREBATCH])
                       for k in range(num_prebatches)]
            write_input(os.path.join(directory, f"categorical_{i}"), batches, "int32", multihot=True)
        with open(os.path.join(directory, "length.json"), "w") as handle:
            json.dump(num_prebatches, handle)
    features = {"label": {"dtype": "bool"}, **{f"num_{j}": {"dtype": "float16"} for j in range(4)}}
    for i, (c, h) in enumerate(zip(CARDINALITIES, HOTNESS)):
        features[f"cat_{i}.bin"] = {"dtype": "int32", "cardinality": c, **({"hotness": h} if h > 1 else {})}
    spec = {"feature_spec": features, "channel_spec": {"label": ["label"], "numerical": [f"num_{j}" for j in range(4)],
                                                       "categorical": [f"cat_{i}.bin" for i in range(3)]}}
    with open(os.path.join(root, "feature_spec.yaml"), "w") as handle:
        yaml.safe_dump(spec, handle)
    return numerical, ids, label


def test_reads_any_batch_size_with_each_ranks_slice(tmp_path):
    numerical, ids, label = write_dataset(str(tmp_path))
    spec = FeatureSpec.load(str(tmp_path / "feature_spec.yaml"), check_files=False)
    reader = SplitTFRecordsReader(spec, "train", 48, rank=1, world_size=2, global_categorical=[1], local_categorical=[0, 2])
    assert reader.num_batches == 40 * PREBATCH // 48
    batches = list(reader.dataset())
    assert len(batches) == reader.num_batches
    dense, categorical, labels = batches[3]
    start = 3 * 48
    np.testing.assert_allclose(dense.numpy(), numerical[start + 24:start + 48].astype(np.float32))
    np.testing.assert_array_equal(categorical[0].numpy(), ids[1][start:start + 48])  # global: all 48 samples
    np.testing.assert_array_equal(categorical[1].numpy(), ids[0][start + 24:start + 48, 0])
    np.testing.assert_array_equal(categorical[2].numpy(), ids[2][start + 24:start + 48])
    np.testing.assert_array_equal(labels.numpy()[:, 0], label[start + 24:start + 48, 0])


def test_a_row_of_the_wrong_hotness_is_named(tmp_path):
    write_dataset(str(tmp_path), num_prebatches=2, bad_row=True)
    spec = FeatureSpec.load(str(tmp_path / "feature_spec.yaml"), check_files=False)
    reader = SplitTFRecordsReader(spec, "train", 32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"categorical_1 \(feature .+cat_1.bin.+hotness=3"):
        list(reader.dataset())


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
