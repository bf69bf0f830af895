"""The bring-your-own examples in feature_specs/: reproducible, loadable, and transcodable as documented."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from criteo_reference import CSV_SAMPLE
from tf_dlrm.preprocessing.criteo import PreprocessConfig, preprocess
from tf_dlrm.spec.feature_spec import FeatureSpec

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPOSITORY, "feature_specs", "byo_example")
RAW_SPEC = os.path.join(REPOSITORY, "feature_specs", "criteo_kaggle_sample_csv.yaml")


def load_generator():
    spec = importlib.util.spec_from_file_location("make_byo_example", os.path.join(EXAMPLE, "make_byo_example.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_checked_in_example_is_what_the_generator_makes(tmp_path):
    load_generator().build(CSV_SAMPLE, str(tmp_path))
    for name in ("feature_spec.yaml", "train.csv", "test.csv"):
        with open(os.path.join(EXAMPLE, name), "rb") as checked_in, open(tmp_path / name, "rb") as regenerated:
            assert checked_in.read() == regenerated.read(), f"{name} is stale: run {EXAMPLE}/make_byo_example.py"


def test_transcoding_the_example_rebuilds_the_preprocessed_files(tmp_path):
    transcode = pytest.importorskip("tf_dlrm.data.transcode")
    written = transcode.transcode(os.path.join(EXAMPLE, "feature_spec.yaml"), str(tmp_path / "byo"))
    preprocess(PreprocessConfig(inputs=(CSV_SAMPLE,), output_dir=str(tmp_path / "criteo"), frequency_threshold=2,
                                test_fraction=0.2, num_workers=2))
    reference = FeatureSpec.load(str(tmp_path / "criteo" / "feature_spec.yaml"))
    assert written.cardinalities() == reference.cardinalities()
    for split in ("train", "test"):
        ours, theirs = written.split_files(split), reference.split_files(split)
        assert ours.num_samples == theirs.num_samples
        assert np.array_equal(np.fromfile(ours.label, np.uint8), np.fromfile(theirs.label, np.uint8))
        with open(ours.numerical, "rb") as a, open(theirs.numerical, "rb") as b:
            assert a.read() == b.read(), f"{split}: numerical values do not round-trip through the CSV"
        for name, left, right in zip(written.categorical_features, ours.categorical, theirs.categorical):
            with open(left, "rb") as a, open(right, "rb") as b:
                assert a.read() == b.read(), f"{split}: {name}"


def test_raw_kaggle_spec_loads_and_transcode_explains_why_it_cannot_convert_it(tmp_path):
    spec = FeatureSpec.load(RAW_SPEC, check_files=True)
    assert spec.categorical_features == [f"C{i}" for i in range(1, 27)]
    assert os.path.samefile(spec.resolve(spec.chunks("train")[0]["files"][0]), CSV_SAMPLE)
    transcode = pytest.importorskip("tf_dlrm.data.transcode")
    with pytest.raises(transcode.TranscodeError, match=r"criteo_kaggle_sample_200.csv, line 2: missing value in column 2 \('I1'\)"):
        transcode.transcode(RAW_SPEC, str(tmp_path / "out"))
