"""A split_binary dataset written in NVIDIA's split_tfrecords layout (python -m tf_dlrm.data.to_split_tfrecords)
reads back through tf_dlrm's split_tfrecords reader as the same samples, and its records are the bytes an
independent writer of NVIDIA's layout (tests/data/test_split_tfrecords.py, after their PrebatchStreamWriter)
serializes for the same pre-batch."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tf_dlrm.data.reader import SplitBinaryReader
from tf_dlrm.data.split_tfrecords import SplitTFRecordsReader, ragged_by_default
from tf_dlrm.data.synthetic import generate
from tf_dlrm.data.to_split_tfrecords import _serialized, convert, main
from tf_dlrm.spec.feature_spec import FeatureSpec

SPEC = os.path.join(os.path.dirname(__file__), "..", "..", "feature_specs", "synthetic_multi_hot.yaml")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("to_tfrecords")
    spec = FeatureSpec.load(SPEC, check_files=False)
    generate(spec, str(root / "binary"), num_train_samples=1050, num_valid_samples=300, seed=4)
    written = convert(str(root / "binary"), str(root / "records"), prebatch_size=100, prebatches_per_file=4)
    return root, written


def test_the_same_samples_read_back(converted):
    root, written = converted
    binary = FeatureSpec.load(str(root / "binary" / "feature_spec.yaml"))
    records = ragged_by_default(FeatureSpec.load(str(root / "records" / "feature_spec.yaml"), check_files=False))
    assert written == {split: -(-binary.split_files(split).num_samples // 100) for split in binary.splits}
    assert json.load(open(root / "records" / "train" / "length.json")) == 11  # 1050 samples: the last pre-batch holds 50
    names = binary.categorical_features
    # 11 pre-batches of up to 100 (the last holds 50): 16 batches of 64, not 1100 // 64 = 17.
    reader = SplitTFRecordsReader(records, "train", 64)
    assert reader.num_batches == 1050 // 64 == len(list(reader.dataset()))
    for split in binary.splits:
        expected = list(SplitBinaryReader(binary, split, 150, input_modes=dict.fromkeys(names, "local")).dataset())
        got = list(SplitTFRecordsReader(records, split, 150).dataset())
        assert len(got) == len(expected) > 0
        for (f1, l1), (f2, l2) in zip(expected, got):
            assert sorted(f1) == sorted(f2) == sorted(["numerical", *names])
            np.testing.assert_array_equal(l1.numpy(), l2.numpy())
            np.testing.assert_array_equal(f1["numerical"].numpy().astype(np.float16), f2["numerical"].numpy().astype(np.float16))
            for name in names:
                a, b = f1[name], f2[name]
                b = b.to_tensor() if isinstance(b, tf.RaggedTensor) else b
                np.testing.assert_array_equal(np.reshape(a.numpy(), (150, -1)), np.reshape(b.numpy(), (150, -1)), err_msg=name)


def test_records_are_what_an_independent_writer_of_nvidias_layout_writes(converted, tmp_path):
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from test_split_tfrecords import write_input

    root, _ = converted
    binary = FeatureSpec.load(str(root / "binary" / "feature_spec.yaml"))
    multi = next(i for i, name in enumerate(binary.categorical_features) if binary.hotness(name) > 1)
    hotness = binary.hotness(binary.categorical_features[multi])
    ids = np.fromfile(binary.split_files("train").categorical[multi], binary.dtype(binary.categorical_features[multi]))
    first = ids[:100 * hotness].reshape(100, hotness)
    write_input(str(tmp_path / "theirs"), [(first.reshape(-1), np.full(100, hotness))], "int32", multihot=True)
    theirs = next(iter(tf.data.TFRecordDataset(str(tmp_path / "theirs" / "data_0.tfrecords")))).numpy()
    ours = next(iter(tf.data.TFRecordDataset(str(root / "records" / "train" / f"categorical_{multi}" / "data_0.tfrecords")))).numpy()
    assert ours == theirs
    assert _serialized(tf, first, "int32", hotness) in ours
    meta = json.load(open(root / "records" / "train" / f"categorical_{multi}" / "format.json"))
    assert meta == {"format": "tfrecords", "dtype": "int32", "multihot": True, "feature_name": "data", "num_features": 1,
                    "batches_per_file": 4}


def test_bad_settings_are_refused_in_one_line(converted, tmp_path, capsys):
    root, _ = converted
    assert main([f"--dataset_path={root / 'binary'}", f"--output_dir={tmp_path / 'x'}", "--prebatch_size=0"]) == 2
    assert "Expected --prebatch_size and --prebatches_per_file >= 1" in capsys.readouterr().err
    assert main([f"--dataset_path={root / 'binary'}", f"--output_dir={root / 'binary'}"]) == 2  # its own input
    assert "--output_dir" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and (root / "binary" / "feature_spec.yaml").is_file()
