"""The bring-your-own examples in feature_specs/: reproducible, loadable, and transcodable as documented."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
import yaml

from preprocessing.criteo import PreprocessConfig, preprocess
from tf_dlrm.spec.feature_spec import FeatureSpec

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPOSITORY, "feature_specs", "byo_example")
RAW_SPEC = os.path.join(REPOSITORY, "feature_specs", "criteo_kaggle_sample_csv.yaml")


def load_generator():
    spec = importlib.util.spec_from_file_location("make_byo_example", os.path.join(EXAMPLE, "make_byo_example.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_checked_in_example_is_what_the_generator_makes(tmp_path, real_criteo):
    load_generator().build(real_criteo.csv, str(tmp_path))
    for name in ("feature_spec.yaml", "train.csv", "test.csv"):
        with open(os.path.join(EXAMPLE, name), "rb") as checked_in, open(tmp_path / name, "rb") as regenerated:
            assert checked_in.read() == regenerated.read(), f"{name} is stale: run {EXAMPLE}/make_byo_example.py"


def test_transcoding_the_example_rebuilds_the_preprocessed_files(tmp_path, criteo):
    """The example made from the samples (on the real one, the checked-in example: see the test above)."""
    transcode = pytest.importorskip("tf_dlrm.data.transcode")
    (tmp_path / "example").mkdir()
    load_generator().build(criteo.csv, str(tmp_path / "example"))
    written = transcode.transcode(str(tmp_path / "example" / "feature_spec.yaml"), str(tmp_path / "byo"))
    preprocess(PreprocessConfig(inputs=(criteo.csv,), output_dir=str(tmp_path / "criteo"), frequency_threshold=2,
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


def test_raw_kaggle_spec_loads_and_transcode_explains_why_it_cannot_convert_it(tmp_path, criteo):
    """The checked-in spec names ../shared/data's sample; a copy names ``criteo.csv`` (real or generated)."""
    raw = yaml.safe_load(open(RAW_SPEC, encoding="utf-8"))
    assert raw["source_spec"]["train"][0]["files"] == ["../../shared/data/criteo_kaggle_sample_200.csv"]
    raw["source_spec"]["train"][0]["files"] = [criteo.csv]
    (tmp_path / "raw.yaml").write_text(yaml.safe_dump(raw))
    spec = FeatureSpec.load(str(tmp_path / "raw.yaml"), check_files=True)
    assert spec.categorical_features == [f"C{i}" for i in range(1, 27)]
    assert os.path.samefile(spec.resolve(spec.chunks("train")[0]["files"][0]), criteo.csv)
    transcode = pytest.importorskip("tf_dlrm.data.transcode")
    name = os.path.basename(criteo.csv).replace(".", r"\.")
    with pytest.raises(transcode.TranscodeError, match=name + r", line 2: missing value in column 2 \('I1'\)"):
        transcode.transcode(str(tmp_path / "raw.yaml"), str(tmp_path / "out"))
