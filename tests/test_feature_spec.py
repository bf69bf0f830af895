"""FeatureSpec: every validation error names what is wrong; save/load round trip; atomic save."""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import yaml

from tf_dlrm.data.layout import with_split_binary_sources
from tf_dlrm.spec.feature_spec import FeatureSpec
from tf_dlrm.spec.format import FeatureSpecError, categorical_dtype_for


def _raw_spec() -> dict:
    """A small NVIDIA-style spec written out by hand (not with nvidia_layout)."""
    return {
        "feature_spec": {
            "label": {"dtype": "bool"},
            "num_0": {"dtype": "float16"},
            "num_1": {"dtype": "float16"},
            "cat_0.bin": {"dtype": "int8", "cardinality": 10},
            "cat_1.bin": {"dtype": "int16", "cardinality": 300},
        },
        "channel_spec": {"label": ["label"], "numerical": ["num_0", "num_1"], "categorical": ["cat_0.bin", "cat_1.bin"]},
        "source_spec": {
            "train": [
                {"type": "split_binary", "features": ["label"], "files": ["train/label.bin"]},
                {"type": "split_binary", "features": ["num_0", "num_1"], "files": ["train/numerical.bin"]},
                {"type": "split_binary", "features": ["cat_0.bin"], "files": ["train/cat_0.bin"]},
                {"type": "split_binary", "features": ["cat_1.bin"], "files": ["train/cat_1.bin"]},
            ]
        },
        "metadata": {"note": "hand written"},
    }


def _write(directory, raw: dict, num_samples: int = 5) -> str:
    """Writes the yaml and data files of ``num_samples`` samples; returns the yaml path."""
    train = os.path.join(directory, "train")
    os.makedirs(train, exist_ok=True)
    np.zeros(num_samples, np.bool_).tofile(os.path.join(train, "label.bin"))
    np.zeros((num_samples, 2), np.float16).tofile(os.path.join(train, "numerical.bin"))
    np.zeros(num_samples, np.int8).tofile(os.path.join(train, "cat_0.bin"))
    np.zeros(num_samples, np.int16).tofile(os.path.join(train, "cat_1.bin"))
    path = os.path.join(directory, "feature_spec.yaml")
    with open(path, "w") as handle:
        yaml.safe_dump(raw, handle)
    return path


def _expect_error(raw: dict, *fragments: str, check_files: bool = False) -> str:
    with pytest.raises(FeatureSpecError) as caught:
        FeatureSpec.from_dict(raw, source="spec.yaml", check_files=check_files)
    message = str(caught.value)
    for fragment in ("spec.yaml",) + fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def test_valid_spec_loads_with_files(tmp_path):
    spec = FeatureSpec.load(_write(tmp_path, _raw_spec(), num_samples=7))
    assert spec.cardinalities() == [10, 300]
    assert spec.split_files("train").num_samples == 7
    assert spec.split_files("train").categorical[1] == os.path.join(tmp_path, "train", "cat_1.bin")


def test_unknown_channel_is_named():
    raw = _raw_spec()
    raw["channel_spec"]["dense"] = ["num_0"]
    _expect_error(raw, "dense", "channel")


def test_channel_feature_missing_from_feature_spec_is_named():
    raw = _raw_spec()
    raw["channel_spec"]["categorical"].append("cat_9.bin")
    _expect_error(raw, "cat_9.bin", "feature_spec")


@pytest.mark.parametrize("cardinality", ["missing", 0, -3, 2.5, "7", True])
def test_categorical_needs_positive_integer_cardinality(cardinality):
    raw = _raw_spec()
    if cardinality == "missing":
        del raw["feature_spec"]["cat_1.bin"]["cardinality"]
    else:
        raw["feature_spec"]["cat_1.bin"]["cardinality"] = cardinality
    _expect_error(raw, "cat_1.bin", "cardinality")


@pytest.mark.parametrize("feature,dtype", [("num_1", "float64"), ("cat_0.bin", "uint8"), ("label", "string")])
def test_unsupported_dtype_is_named(feature, dtype):
    raw = _raw_spec()
    raw["feature_spec"][feature]["dtype"] = dtype
    _expect_error(raw, feature, dtype)


def test_cardinality_too_large_for_dtype():
    raw = _raw_spec()
    raw["feature_spec"]["cat_0.bin"]["cardinality"] = 1000  # int8 holds ids up to 127
    _expect_error(raw, "cat_0.bin", "int8")


def test_missing_data_file_is_named(tmp_path):
    path = _write(tmp_path, _raw_spec())
    os.unlink(os.path.join(tmp_path, "train", "cat_1.bin"))
    with pytest.raises(FeatureSpecError, match="not found") as caught:
        FeatureSpec.load(path)
    assert os.path.join(str(tmp_path), "train", "cat_1.bin") in str(caught.value)
    FeatureSpec.load(path, check_files=False)  # structure alone is still fine


def test_truncated_file_is_named(tmp_path):
    path = _write(tmp_path, _raw_spec())
    numerical = os.path.join(tmp_path, "train", "numerical.bin")
    with open(numerical, "ab") as handle:
        handle.write(b"\x00\x00")  # half a record: two float16 features make 4 bytes
    with pytest.raises(FeatureSpecError) as caught:
        FeatureSpec.load(path)
    assert numerical in str(caught.value) and "4-byte records" in str(caught.value)


def test_files_of_one_split_with_different_counts(tmp_path):
    path = _write(tmp_path, _raw_spec(), num_samples=5)
    np.zeros(6, np.int16).tofile(os.path.join(tmp_path, "train", "cat_1.bin"))
    with pytest.raises(FeatureSpecError) as caught:
        FeatureSpec.load(path)
    message = str(caught.value)
    assert "different sample counts" in message and "cat_1.bin=6" in message and "label.bin=5" in message


def test_files_outside_the_spec_directory_are_named(tmp_path):
    """NVIDIA's format allows any path relative to the yaml (and absolute ones): they are accepted, but a
    run names them, and a count mismatch shows such a file's full path rather than its base name."""
    data, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    elsewhere.mkdir()
    raw = _raw_spec()
    raw["source_spec"]["train"][0]["files"] = ["../elsewhere/passwd"]
    raw["source_spec"]["train"][2]["files"] = [str(data / "train" / "cat_0.bin")]  # absolute, but inside
    path = _write(data, raw, num_samples=5)
    (elsewhere / "passwd").write_bytes(b"root:x:0:0\n")  # 11 one-byte "labels"
    with pytest.raises(FeatureSpecError) as caught:
        FeatureSpec.load(path)
    assert (f"files hold different sample counts: {elsewhere / 'passwd'} (outside the spec's directory)=11, "
            "numerical.bin=5, cat_0.bin=5, cat_1.bin=5") in str(caught.value)
    np.zeros(5, np.bool_).tofile(elsewhere / "passwd")
    spec = FeatureSpec.load(path)
    assert spec.files_outside() == [f"'label' (split 'train'): ../elsewhere/passwd -> {elsewhere / 'passwd'}"]


def test_a_file_written_in_another_dtype_gets_a_hint(tmp_path):
    path = _write(tmp_path, _raw_spec(), num_samples=5)
    np.zeros(5, np.int32).tofile(os.path.join(tmp_path, "train", "cat_1.bin"))  # the spec says int16
    with pytest.raises(FeatureSpecError) as caught:
        FeatureSpec.load(path)
    assert ("cat_1.bin holds exactly 5 samples of 4-byte values, and the spec declares 'cat_1.bin' as int16 (2 bytes): "
            "is it int32 or float32?") in str(caught.value)


def test_missing_yaml_and_bad_yaml(tmp_path):
    with pytest.raises(FeatureSpecError, match="not found"):
        FeatureSpec.load(str(tmp_path / "absent.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("feature_spec: [unclosed\n")
    with pytest.raises(FeatureSpecError, match="bad.yaml"):
        FeatureSpec.load(str(bad))


def test_chunk_with_undefined_feature_and_bad_type():
    raw = _raw_spec()
    raw["source_spec"]["train"][2]["features"] = ["cat_7.bin"]
    _expect_error(raw, "cat_7.bin", "source_spec.train[2]")
    raw = _raw_spec()
    raw["source_spec"]["train"][0]["type"] = "orc"
    _expect_error(raw, "orc", "source_spec.train[0]")


def test_save_load_round_trip(tmp_path):
    spec = FeatureSpec.from_dict(_raw_spec())
    path = str(tmp_path / "out" / "feature_spec.yaml")
    spec.save(path)
    loaded = FeatureSpec.load(path, check_files=False)
    assert loaded.to_dict() == spec.to_dict()
    assert loaded.base_directory == str(tmp_path / "out")
    assert loaded.metadata == {"note": "hand written"}


def test_save_replaces_atomically(tmp_path, monkeypatch):
    path = str(tmp_path / "feature_spec.yaml")
    FeatureSpec.from_dict(_raw_spec()).save(path)
    before = open(path).read()
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's private 0600

    changed = _raw_spec()
    changed["metadata"] = {"note": "second"}
    real_dump = yaml.safe_dump

    def failing_dump(data, stream, **kwargs):
        stream.write("feature_spec: {half")  # a partial write, then the failure
        raise OSError("disk full")

    monkeypatch.setattr(yaml, "safe_dump", failing_dump)
    with pytest.raises(OSError, match="disk full"):
        FeatureSpec.from_dict(changed).save(path)
    monkeypatch.setattr(yaml, "safe_dump", real_dump)
    assert open(path).read() == before
    assert os.listdir(tmp_path) == ["feature_spec.yaml"]  # no temporary file left

    FeatureSpec.from_dict(changed).save(path)
    assert FeatureSpec.load(path, check_files=False).metadata == {"note": "second"}
    assert os.listdir(tmp_path) == ["feature_spec.yaml"]


def test_categorical_dtype_rule():
    assert categorical_dtype_for(3) == np.int8
    assert categorical_dtype_for(126) == np.int8
    assert categorical_dtype_for(127) == np.int16  # NVIDIA's rule: cardinality < iinfo.max
    assert categorical_dtype_for(40000) == np.int32
    assert categorical_dtype_for(2**31) == np.int64


def test_with_split_binary_sources_layout(tmp_path):
    raw = copy.deepcopy(_raw_spec())
    raw["feature_spec"]["cat_1.bin"]["dtype"] = "int64"
    spec = with_split_binary_sources(FeatureSpec.from_dict(raw), ["train", "test"], str(tmp_path))
    assert spec.dtype("cat_1.bin") == np.int16
    assert [c["files"] for c in spec.chunks("test")] == [
        ["test/label.bin"], ["test/numerical.bin"], ["test/cat_0.bin"], ["test/cat_1.bin"]
    ]
    spec.validate(check_files=False)


@pytest.mark.parametrize("feature, key, nearest", [
    ("cat_0.bin", "embeding_dim", "embedding_dim"),
    ("cat_1.bin", "hotnes", "hotness"),
    ("cat_1.bin", "combinr", "combiner"),
    ("cat_0.bin", "cardinalty", "cardinality"),  # beside a correct cardinality: ignored before
    ("num_0", "dtyp", "dtype"),
    ("cat_1.bin", "capacty", "capacity"),
])
def test_misspelt_feature_key_is_refused_with_the_nearest_key(feature, key, nearest):
    raw = _raw_spec()
    raw["feature_spec"][feature][key] = 4
    message = _expect_error(raw, f"feature_spec.{feature} (feature '{feature}'): unknown key '{key}'; "
                                 f"did you mean '{nearest}'?")
    assert "\n" not in message


def test_misspelt_top_level_and_chunk_keys_name_the_nearest_key():
    raw = _raw_spec()
    raw["chanel_spec"] = raw.pop("channel_spec")
    _expect_error(raw, "top level: unknown key 'chanel_spec'; did you mean 'channel_spec'?")
    raw = _raw_spec()
    raw["source_spec"]["train"][0]["file"] = raw["source_spec"]["train"][0].pop("files")
    _expect_error(raw, "source_spec.train[0]: unknown key 'file'; did you mean 'files'?")


def test_every_key_of_nvidia_and_tf_dlrm_specs_is_accepted(tmp_path):
    """No valid spec is refused: DLE's DLRM_and_DCNv2 keys (their synthetic specs carry hotness and
    alpha), tf_dlrm's embedding_dim/combiner, dynamic tables' keys and transcode's records."""
    import glob

    repository = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # byo_raw_example is transcode's input (cardinalities come from its vocabulary), not a training spec.
    paths = [p for p in glob.glob(os.path.join(repository, "feature_specs", "**", "*.yaml"), recursive=True)
             if not p.endswith(os.path.join("byo_raw_example", "feature_spec.yaml"))]
    assert len(paths) >= 6
    for path in paths:
        FeatureSpec.load(path, check_files=False)
    raw = _raw_spec()
    # Shaped as DLE's generate_feature_spec.py writes it (int32 ids, int8 label, hotness and alpha).
    raw["feature_spec"]["cat_0.bin"].update({"dtype": "int32", "hotness": 3, "alpha": 1.45})
    raw["feature_spec"]["label"] = {"dtype": "int8"}
    raw["feature_spec"]["cat_1.bin"].update({"embedding_dim": 8, "combiner": "mean", "encoded": "vocabulary",
                                             "vocabulary": "vocabulary/cat_1.txt", "oov_id": 0,
                                             "transform": {"steps": []}})
    raw["source_spec"] = {}
    FeatureSpec.from_dict(raw)
    raw["feature_spec"]["cat_0.bin"] = {"dtype": "int64", "dynamic": True, "capacity": 100, "capacity_scope": "total",
                                        "eviction": "lru", "min_count": 2}
    FeatureSpec.from_dict(raw)
