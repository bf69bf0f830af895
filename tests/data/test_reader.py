"""SplitBinaryReader on a dataset written here by plain numpy in NVIDIA's layout (not our writer)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import yaml

from tf_dlrm.data.reader import SplitBinaryReader, read_columns
from tf_dlrm.spec.feature_spec import FeatureSpec
from tf_dlrm.spec.format import NUMERICAL_CHANNEL

NUM_SAMPLES = 103
NUM_NUMERICAL = 3
CARDINALITIES = {"cat_0.bin": (5, np.int8), "cat_1.bin": (200, np.int16), "cat_2.bin": (40000, np.int32)}
NAMES = list(CARDINALITIES)  # the categorical features, named by their files


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """(spec, expected values) for a 103-sample split written with numpy and yaml.safe_dump."""
    directory = tmp_path_factory.mktemp("nvidia_layout")
    rng = np.random.default_rng(0)
    label = rng.random(NUM_SAMPLES) < 0.4
    numerical = (rng.normal(size=(NUM_SAMPLES, NUM_NUMERICAL)) * 100).astype(np.float16)
    categorical = [rng.integers(0, cardinality, NUM_SAMPLES).astype(dtype) for cardinality, dtype in CARDINALITIES.values()]
    os.makedirs(directory / "train")
    label.astype(np.bool_).tofile(directory / "train" / "label.bin")
    numerical.tofile(directory / "train" / "numerical.bin")  # row-major: a sample's features side by side
    for name, ids in zip(CARDINALITIES, categorical):
        ids.tofile(directory / "train" / name)
    numerical_names = [f"num_{i}" for i in range(NUM_NUMERICAL)]
    raw = {
        "feature_spec": {
            "label": {"dtype": "bool"},
            **{name: {"dtype": "float16"} for name in numerical_names},
            **{name: {"dtype": np.dtype(dtype).name, "cardinality": c} for name, (c, dtype) in CARDINALITIES.items()},
        },
        "channel_spec": {"label": ["label"], "numerical": numerical_names, "categorical": list(CARDINALITIES)},
        "source_spec": {
            "train": [{"type": "split_binary", "features": ["label"], "files": ["train/label.bin"]},
                      {"type": "split_binary", "features": numerical_names, "files": ["train/numerical.bin"]}]
            + [{"type": "split_binary", "features": [name], "files": [f"train/{name}"]} for name in CARDINALITIES]
        },
        "metadata": {},
    }
    with open(directory / "feature_spec.yaml", "w") as handle:
        yaml.safe_dump(raw, handle)
    spec = FeatureSpec.load(str(directory / "feature_spec.yaml"))
    expected = {"label": label.astype(np.float32)[:, None], "numerical": numerical.astype(np.float32), "categorical": categorical}
    return spec, expected


def _collect(reader, epoch=0, start_batch=0):
    """``[(features as numpy by name, label)]`` of one epoch."""
    return [({name: tensor.numpy() for name, tensor in features.items()}, label.numpy())
            for features, label in reader.dataset(epoch, start_batch)]


def test_reads_back_exact_values(dataset):
    spec, expected = dataset
    reader = SplitBinaryReader(spec, "train", global_batch_size=25, last_batch="keep")
    batches = _collect(reader)
    assert reader.num_batches == len(batches) == 5 and batches[-1][1].shape == (3, 1)
    assert all(list(b[0]) == [NUMERICAL_CHANNEL, *NAMES] for b in batches)
    numerical = np.concatenate([b[0][NUMERICAL_CHANNEL] for b in batches])
    assert numerical.dtype == np.float32
    np.testing.assert_array_equal(numerical, expected["numerical"])  # exact after float16 rounding
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), expected["label"])
    for index, name in enumerate(NAMES):
        ids = np.concatenate([b[0][name] for b in batches])
        assert ids.dtype == np.int32
        np.testing.assert_array_equal(ids, expected["categorical"][index])


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_rank_slices_reassemble_global_batch(dataset, world_size):
    spec, expected = dataset
    batch = 12
    readers = [
        SplitBinaryReader(spec, "train", batch, rank=r, world_size=world_size,
                          input_modes={NAMES[2]: "global", NAMES[0]: "local", NAMES[1]: "local"})
        for r in range(world_size)
    ]
    assert readers[0].num_batches == NUM_SAMPLES // batch
    for b in range(readers[0].num_batches):
        rows = slice(b * batch, (b + 1) * batch)
        parts = [reader.read_batch(b) for reader in readers]
        np.testing.assert_array_equal(np.concatenate([p[2] for p in parts]), expected["label"][rows])
        np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), expected["numerical"][rows])
        for numerical, categorical, label in parts:
            assert label.shape == (batch // world_size, 1)
            np.testing.assert_array_equal(categorical[0], expected["categorical"][2][rows])  # global: whole batch
        for position, feature in ((1, 0), (2, 1)):  # read_batch: global columns, then local ones in spec order
            joined = np.concatenate([p[1][position] for p in parts])
            np.testing.assert_array_equal(joined, expected["categorical"][feature][rows])


def test_global_and_local_features_by_name_and_static_shapes(dataset):
    spec, expected = dataset
    reader = SplitBinaryReader(spec, "train", 10, rank=1, world_size=2,
                               input_modes={NAMES[2]: "global", NAMES[0]: "global", NAMES[1]: "local"})
    features, label = next(iter(reader.dataset()))
    assert features[NUMERICAL_CHANNEL].shape == (5, 3) and label.shape == (5, 1)
    # The static shapes say which rows each feature holds: the global batch's 10, or this rank's 5.
    assert {name: tuple(ids.shape) for name, ids in features.items() if name != NUMERICAL_CHANNEL} == {
        NAMES[2]: (10,), NAMES[0]: (10,), NAMES[1]: (5,)}
    np.testing.assert_array_equal(features[NAMES[2]].numpy(), expected["categorical"][2][:10])
    np.testing.assert_array_equal(features[NAMES[0]].numpy(), expected["categorical"][0][:10])
    np.testing.assert_array_equal(features[NAMES[1]].numpy(), expected["categorical"][1][5:10])
    # No modes: every feature local; modes given: only the features they name are read.
    assert SplitBinaryReader(spec, "train", 10).local_categorical == (0, 1, 2)
    partial = SplitBinaryReader(spec, "train", 10, input_modes={NAMES[1]: "global", NUMERICAL_CHANNEL: "local"})
    assert (partial.global_categorical, partial.local_categorical) == ((1,), ())
    assert list(next(iter(partial.dataset()))[0]) == [NUMERICAL_CHANNEL, NAMES[1]]
    assert read_columns(spec, {NAMES[2]: "local", NAMES[0]: "global"}) == ((0,), (2,))


def test_shuffle_is_seeded_and_changes_per_epoch(dataset):
    spec, expected = dataset
    make = lambda seed: SplitBinaryReader(spec, "train", 10, shuffle=True, seed=seed)
    order = make(5).batch_order(0)
    assert sorted(order) == list(range(10)) and list(order) != list(range(10))
    np.testing.assert_array_equal(order, make(5).batch_order(0))
    assert list(make(5).batch_order(1)) != list(order)
    assert list(make(6).batch_order(0)) != list(order)
    assert list(SplitBinaryReader(spec, "train", 10).batch_order(3)) == list(range(10))
    for position, (features, label) in enumerate(_collect(make(5), epoch=1)):
        rows = slice(make(5).batch_order(1)[position] * 10, (make(5).batch_order(1)[position] + 1) * 10)
        np.testing.assert_array_equal(label, expected["label"][rows])
        np.testing.assert_array_equal(features[NAMES[1]], expected["categorical"][1][rows])


def test_start_batch_resumes_the_epoch_order(dataset):
    spec, expected = dataset
    reader = SplitBinaryReader(spec, "train", 10, shuffle=True, seed=2)
    resumed = _collect(reader, epoch=1, start_batch=7)
    order = reader.batch_order(1)[7:]
    assert len(resumed) == 3
    for b, (_, label) in zip(order, resumed):
        np.testing.assert_array_equal(label, expected["label"][b * 10:(b + 1) * 10])


def test_last_batch_drop_keep_pad(dataset):
    spec, expected = dataset
    drop = SplitBinaryReader(spec, "train", 10, last_batch="drop")
    keep = SplitBinaryReader(spec, "train", 10, last_batch="keep")
    pad = SplitBinaryReader(spec, "train", 10, last_batch="pad")
    assert (drop.num_batches, keep.num_batches, pad.num_batches) == (10, 11, 11)
    assert len(_collect(drop)) == 10
    kept = _collect(keep)[-1]
    np.testing.assert_array_equal(kept[1], expected["label"][100:])
    padded_features, padded_label = _collect(pad)[-1]
    assert padded_label.shape == (10, 1)
    np.testing.assert_array_equal(padded_features[NUMERICAL_CHANNEL][:3], expected["numerical"][100:])
    assert not padded_features[NUMERICAL_CHANNEL][3:].any() and not padded_label[3:].any()
    assert not padded_features[NAMES[2]][3:].any()
    np.testing.assert_array_equal(padded_features[NAMES[2]][:3], expected["categorical"][2][100:])


def test_pad_across_ranks(dataset):
    spec, expected = dataset
    modes = {NAMES[0]: "global", NAMES[1]: "local", NAMES[2]: "local"}
    ranks = [SplitBinaryReader(spec, "train", 10, rank=r, world_size=2, last_batch="pad", input_modes=modes)
             for r in (0, 1)]
    first, second = (reader.read_batch(10) for reader in ranks)
    np.testing.assert_array_equal(first[2][:3], expected["label"][100:])
    assert first[2].shape == second[2].shape == (5, 1)
    assert not first[2][3:].any() and not second[0].any() and not second[1][1].any()
    np.testing.assert_array_equal(second[1][0][:3], expected["categorical"][0][100:])  # global ids, padded to B


def test_argument_errors(dataset):
    spec, _ = dataset
    with pytest.raises(ValueError, match="divide.*batch_size=10, world_size=3"):
        SplitBinaryReader(spec, "train", 10, rank=0, world_size=3)
    with pytest.raises(ValueError, match="rank=2, world_size=2"):
        SplitBinaryReader(spec, "train", 10, rank=2, world_size=2)
    with pytest.raises(ValueError, match="last_batch"):
        SplitBinaryReader(spec, "train", 10, last_batch="wrap")
    with pytest.raises(ValueError, match="global_batch_size=0"):
        SplitBinaryReader(spec, "train", 0)
    with pytest.raises(ValueError, match=r"Received: \['cat_3.bin'\]"):
        SplitBinaryReader(spec, "train", 10, input_modes={"cat_3.bin": "global"})
    with pytest.raises(ValueError, match="'global' or 'local'.*'cat_0.bin': 'both'"):
        SplitBinaryReader(spec, "train", 10, input_modes={NAMES[0]: "both"})
    with pytest.raises(ValueError, match="numerical features local.*'numerical': 'global'"):
        SplitBinaryReader(spec, "train", 10, input_modes={NUMERICAL_CHANNEL: "global"})
