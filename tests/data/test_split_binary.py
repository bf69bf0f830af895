"""SplitBinaryWriter: exact bytes in NVIDIA's layout, range errors, atomic publish and abort."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tf_dlrm.data.split_binary import SplitBinaryWriter
from tf_dlrm.data.layout import nvidia_spec
from tf_dlrm.spec.feature_spec import FeatureSpec

CARDINALITIES = [5, 200, 40000]


def _spec(directory) -> FeatureSpec:
    return nvidia_spec(3, CARDINALITIES, splits=["train"], base_directory=str(directory))


def _block(rng, count):
    label = rng.random(count) < 0.3
    numerical = rng.normal(size=(count, 3)) * 10
    categorical = [rng.integers(0, cardinality, count) for cardinality in CARDINALITIES]
    return label, numerical, categorical


def test_writes_nvidia_layout_bytes(tmp_path):
    rng = np.random.default_rng(0)
    blocks = [_block(rng, 7), _block(rng, 0), _block(rng, 4)]
    with SplitBinaryWriter(_spec(tmp_path), "train") as writer:
        for block in blocks:
            writer.append(*block)
    assert writer.num_samples == 11
    train = tmp_path / "train"
    assert sorted(os.listdir(train)) == ["cat_0.bin", "cat_1.bin", "cat_2.bin", "label.bin", "numerical.bin"]
    label = np.concatenate([b[0] for b in blocks])
    numerical = np.concatenate([b[1] for b in blocks])
    assert (train / "label.bin").read_bytes() == label.astype(np.bool_).tobytes()
    assert (train / "numerical.bin").read_bytes() == numerical.astype(np.float16).tobytes()  # row-major
    for index, dtype in enumerate([np.int8, np.int16, np.int32]):
        ids = np.concatenate([b[2][index] for b in blocks])
        assert (train / f"cat_{index}.bin").read_bytes() == ids.astype(dtype).tobytes()
    spec = _spec(tmp_path)
    spec.validate(check_files=True)
    assert spec.split_files("train").num_samples == 11


@pytest.mark.parametrize("bad_id", [-1, 200])
def test_out_of_range_id_names_feature(tmp_path, bad_id):
    rng = np.random.default_rng(1)
    label, numerical, categorical = _block(rng, 6)
    categorical[1][3] = bad_id
    with pytest.raises(ValueError, match=r"cat_1\.bin.*\[0, 200\)"):
        with SplitBinaryWriter(_spec(tmp_path), "train") as writer:
            writer.append(label, numerical, categorical)
    assert os.listdir(tmp_path / "train") == []  # nothing published, no .partial left


def test_shape_errors(tmp_path):
    rng = np.random.default_rng(2)
    label, numerical, categorical = _block(rng, 4)
    writer = SplitBinaryWriter(_spec(tmp_path), "train")
    with pytest.raises(ValueError, match="numerical block"):
        writer.append(label, numerical[:, :2], categorical)
    with pytest.raises(ValueError, match="expected 3 categorical"):
        writer.append(label, numerical, categorical[:2])
    with pytest.raises(ValueError, match="cat_2.bin.*expected 4 ids"):
        writer.append(label, numerical, categorical[:2] + [categorical[2][:3]])
    writer.abort()


def test_abort_keeps_existing_dataset(tmp_path):
    rng = np.random.default_rng(3)
    with SplitBinaryWriter(_spec(tmp_path), "train") as writer:
        writer.append(*_block(rng, 9))
    train = tmp_path / "train"
    before = {name: (train / name).read_bytes() for name in os.listdir(train)}

    writer = SplitBinaryWriter(_spec(tmp_path), "train")
    writer.append(*_block(rng, 20))
    assert any(name.endswith(".partial") for name in os.listdir(train))  # new data is staged apart
    assert {name: (train / name).read_bytes() for name in before} == before
    writer.abort()
    assert {name: (train / name).read_bytes() for name in os.listdir(train)} == before


def test_exception_inside_context_discards(tmp_path):
    rng = np.random.default_rng(4)
    with pytest.raises(RuntimeError):
        with SplitBinaryWriter(_spec(tmp_path), "train") as writer:
            writer.append(*_block(rng, 5))
            raise RuntimeError("interrupted")
    assert os.listdir(tmp_path / "train") == []
