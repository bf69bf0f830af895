"""Multi-hot data: the spec's hotness and combiner, split_binary files of hotness ids per sample,
the csv transcoder's "12|7|99" cells, the synthetic generator, and every bad input named."""

from __future__ import annotations

import os

import numpy as np
import pytest
import yaml

from tf_dlrm.data.reader import SplitBinaryReader
from tf_dlrm.data.synthetic import generate
from tf_dlrm.data.csv_values import TranscodeError
from tf_dlrm.data.transcode import transcode
from tf_dlrm.spec.feature_spec import FeatureSpec
from tf_dlrm.spec.format import FeatureSpecError

COLUMNS = ["click", "dense", "site", "items"]


def _raw_spec(csv_name="train.csv", hotness=3, combiner="mean"):
    return {
        "feature_spec": {
            "click": {"dtype": "int8"}, "dense": {"dtype": "float32"},
            "site": {"dtype": "int64", "cardinality": 4},
            "items": {"dtype": "int64", "cardinality": 300, "hotness": hotness, "combiner": combiner},
        },
        "channel_spec": {"label": ["click"], "numerical": ["dense"], "categorical": ["site", "items"]},
        "source_spec": {"train": [{"type": "csv", "features": COLUMNS, "files": [csv_name]}]},
    }


def _write(directory, rows, raw=None):
    (directory / "train.csv").write_text("\n".join(",".join(r) for r in rows) + "\n")
    path = directory / "input.yaml"
    path.write_text(yaml.safe_dump(raw or _raw_spec()))
    return str(path)


def test_csv_multi_hot_cells_round_trip_through_split_binary(tmp_path):
    rng = np.random.default_rng(0)
    items = rng.integers(0, 300, (10, 3))
    rows = [[str(i % 2), f"{i}.5", str(i % 4), "|".join(map(str, items[i]))] for i in range(10)]
    spec = transcode(_write(tmp_path, rows), str(tmp_path / "out"))
    assert os.path.getsize(spec.split_files("train").categorical[1]) == 10 * 3 * 2  # int16 ids, 3 per sample
    numerical, categorical, label = SplitBinaryReader(spec, "train", 5).read_batch(1)
    assert categorical[0].shape == (5,)
    np.testing.assert_array_equal(categorical[1], items[5:])
    reloaded = FeatureSpec.load(spec.source)
    assert (reloaded.hotness("items"), reloaded.combiner("items")) == (3, "mean")


@pytest.mark.parametrize("cell, message", [
    ("1|2|3|4", "4 ids in '1|2|3|4', more than the feature's hotness 3"),
    ("1|2", "2 ids in '1|2', fewer than the feature's hotness 3"),
    ("1|300|2", "categorical id 300 is outside [0, 300)"),
    ("1|-1|2", "categorical id -1 is outside [0, 300)"),
])
def test_csv_bad_multi_hot_cells_name_the_line_and_column(tmp_path, cell, message):
    rows = [["0", "1.0", "1", "1|2|3"], ["1", "2.0", "2", cell]]
    with pytest.raises(TranscodeError) as error:
        transcode(_write(tmp_path, rows), str(tmp_path / "out"))
    assert "line 2" in str(error.value) and "column 4 ('items')" in str(error.value)
    assert message in str(error.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.bin"))


@pytest.mark.parametrize("key, value", [("hotness", 0), ("hotness", "3"), ("combiner", "max"), ("embedding_dim", -4)])
def test_spec_rejects_bad_multi_hot_keys(tmp_path, key, value):
    raw = _raw_spec()
    raw["feature_spec"]["items"][key] = value
    with pytest.raises(FeatureSpecError, match=rf"feature_spec\.items.*{key}"):
        FeatureSpec.from_dict(raw)


def test_synthetic_multi_hot_dataset(tmp_path):
    raw = _raw_spec()
    raw.pop("source_spec")
    spec = generate(FeatureSpec.from_dict(raw), str(tmp_path), num_train_samples=4000, num_valid_samples=4000, seed=2)
    files = spec.split_files("train")
    assert os.path.getsize(files.categorical[1]) == 4000 * 3 * 2
    reader = SplitBinaryReader(spec, "train", 100, rank=1, world_size=2, input_modes={"items": "global", "site": "local"})
    features, label = next(iter(reader.dataset()))
    assert features["items"].shape == (100, 3) and features["site"].shape == (50,)
    ids = np.fromfile(files.categorical[1], np.int16).reshape(4000, 3)
    # Power-law ids: the three ids of a sample are drawn independently, not copies of one.
    assert (ids[:, 0] != ids[:, 1]).mean() > 0.3
    assert 0.6 < spec.metadata["oracle_valid_auc"] < 1.0
