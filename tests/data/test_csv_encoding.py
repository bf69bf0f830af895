"""encode: vocabulary and numerical transforms of the csv transcoder (local engine), and their errors."""

from __future__ import annotations

import os

import numpy as np
import pytest
import yaml

from raw_csv import CITIES, write_dataset
from tf_dlrm.data.csv_vocabulary import VocabularyOptions, build_vocabulary, read_vocabulary_file
from tf_dlrm.data.csv_values import TranscodeError
from tf_dlrm.data.transcode import transcode
from tf_dlrm.spec.feature_spec import FeatureSpec


def rows_of(path):
    lines = open(path, encoding="utf-8").read().splitlines()
    header = lines[0].split(",")
    return [dict(zip(header, line.split(","))) for line in lines[1:]]


def test_ids_follow_descending_count_then_value_and_min_count_sends_rare_values_to_oov():
    counts = {"b": 3, "a": 3, "c": 5, "d": 1, "e": 2}
    first = build_vocabulary("f", counts, VocabularyOptions(min_count=2))
    assert first.values == ("c", "a", "b", "e") and first.counts == (5, 3, 3, 2)
    assert first.lookup([" c", "a ", "b", "e", "d", "never"]).tolist() == [1, 2, 3, 4, 0, 0]
    assert first.cardinality == 5 and first.oov_id == 0
    last = build_vocabulary("f", counts, VocabularyOptions(min_count=3, oov="last"))
    assert last.lookup(["c", "a", "b", "e"]).tolist() == [0, 1, 2, 3] and last.cardinality == 4


def test_vocabulary_transcode_numbers_train_values_maps_unseen_test_values_to_oov_and_writes_the_files(tmp_path):
    spec_path = write_dataset(tmp_path, rows=900)
    written = transcode(spec_path, str(tmp_path / "out"), block_lines=64)
    spec = FeatureSpec.load(str(tmp_path / "out" / "feature_spec.yaml"))
    train, test = rows_of(tmp_path / "train0.csv"), rows_of(tmp_path / "test.csv")
    for feature, oov_first, min_count in (("city", True, 1), ("url", False, 3), ("device", True, 1)):
        counts = {}
        for row in train:
            counts[row[feature]] = counts.get(row[feature], 0) + 1
        kept = sorted((v for v in counts if counts[v] >= min_count), key=lambda v: (-counts[v], v))
        properties = spec.feature_spec[feature]
        assert properties["cardinality"] == len(kept) + 1 and properties["encoded"] == "vocabulary"
        oov = 0 if oov_first else len(kept)
        assert properties["oov_id"] == oov
        ids = {value: position + int(oov_first) for position, value in enumerate(kept)}
        mapping = read_vocabulary_file(os.path.join(tmp_path / "out", properties["vocabulary"]))
        assert mapping == {i: v.replace("\\t", "\t") for v, i in ids.items()}
        for split, rows in (("train", train), ("test", test)):
            files = written.split_files(split)
            index = spec.categorical_features.index(feature)
            stored = np.fromfile(files.categorical[index], dtype=spec.dtype(feature))
            assert stored.tolist() == [ids.get(row[feature], oov) for row in rows], (feature, split)
    stored_test_city = np.fromfile(written.split_files("test").categorical[0], dtype=spec.dtype("city"))
    assert (stored_test_city == 0).sum() == sum(row["city"] not in CITIES for row in test) > 0  # "City Nowhere"
    assert spec.dtype("city") == np.int8 and spec.dtype("url") == np.int16


def test_numerical_transforms_log1p_and_clip_in_order(tmp_path):
    spec_path = write_dataset(tmp_path, rows=300, transform={"price": [{"clip": [None, 20]}, "log1p"],
                                                             "visits": {"clip": [0, 30]}})
    written = transcode(spec_path, str(tmp_path / "out"))
    numerical = np.fromfile(written.split_files("train").numerical, dtype=np.float32).reshape(-1, 2)
    rows = rows_of(tmp_path / "train0.csv")
    price = np.log1p(np.minimum(np.array([float(r["price"]) for r in rows]), 20)).astype(np.float32)
    visits = np.clip(np.array([float(r["visits"]) for r in rows]), 0, 30).astype(np.float32)
    assert np.array_equal(numerical[:, 0], price) and np.array_equal(numerical[:, 1], visits)
    assert FeatureSpec.load(written.source).feature_spec["price"]["transform"] == [{"clip": [None, 20.0]}, "log1p"]


def test_log1p_of_a_negative_value_names_file_line_and_column(tmp_path):
    spec_path = write_dataset(tmp_path, rows=300, transform={"visits": "log1p"})
    first_negative = next(i for i, r in enumerate(rows_of(tmp_path / "train0.csv")) if float(r["visits"]) < 0)
    with pytest.raises(TranscodeError, match=rf"train0.csv, line {first_negative + 2}: column 3 \('visits'\): log1p of "
                                             r"the negative value -1 .*declare \[\{clip: \[0, null\]\}, log1p\]"):
        transcode(spec_path, str(tmp_path / "out"), block_lines=50)
    assert not (tmp_path / "out").exists()


def edit_chunks(spec_path, **changes):
    raw = yaml.safe_load(open(spec_path))
    for split, chunks in raw["source_spec"].items():
        for key, value in changes.items():
            if key.startswith("feature_"):
                raw["feature_spec"][key[len("feature_"):]] = value
            elif split == "test" or not key.startswith("test_"):
                name = key.replace("test_", "")  # merged into the declarations of write_dataset (a copy: yaml aliases)
                chunks[0][name] = {**chunks[0][name], **value}
    open(spec_path, "w").write(yaml.safe_dump(raw))


@pytest.mark.parametrize("changes, message", [
    ({"encode": {"city": {"type": "vocabulary", "min_count": 0}}}, r"encode.city.min_count: expected a positive integer. Received: 0"),
    ({"encode": {"city": {"type": "vocabulary", "oov": "middle"}}}, r"encode.city.oov: expected one of \['first', 'last'\]"),
    ({"encode": {"city": {"type": "vocabulary", "threshold": 2}}}, r"encode.city: unknown option\(s\) \['threshold'\]"),
    ({"encode": {"city": "hash"}, "feature_city": {"dtype": "int32", "cardinality": 10}}, r"encode.city: a hashed feature holds raw int64 keys of a one-hot dynamic table"),
    ({"encode": {"price": "vocabulary"}}, r"encode.price: only categorical features are encoded"),
    ({"transform": {"price": {"clip": [5, 1]}}}, r"transform.price.clip: lo must not exceed hi"),
    ({"transform": {"price": {"clip": [0]}}}, r"transform.price.clip: expected \[lo, hi\]"),
    ({"transform": {"price": "sqrt"}}, r"transform.price: unknown transform; expected log1p or \{clip: \[lo, hi\]\}. Received: 'sqrt'"),
    ({"transform": {"city": "log1p"}}, r"transform.city: only numerical features are transformed"),
    ({"test_transform": {"price": {"clip": [0, 10]}}}, r"source_spec.test\[0\].transform differs from source_spec.train\[0\].transform"),
    ({"feature_city": {"dtype": "int32", "cardinality": 10}}, r"feature_spec.city.cardinality: a feature with encode: vocabulary gets its cardinality from the vocabulary"),
])
def test_bad_declarations_name_file_feature_and_option(tmp_path, changes, message):
    spec_path = write_dataset(tmp_path, rows=30)
    edit_chunks(spec_path, **changes)
    with pytest.raises(TranscodeError, match=message) as raised:
        transcode(spec_path, str(tmp_path / "out"))
    assert "spec.yaml" in str(raised.value)
    assert not (tmp_path / "out").exists()


def test_vocabulary_needs_a_train_split(tmp_path):
    spec_path = write_dataset(tmp_path, rows=30)
    raw = yaml.safe_load(open(spec_path))
    raw["source_spec"] = {"valid": raw["source_spec"]["test"]}
    open(spec_path, "w").write(yaml.safe_dump(raw))
    with pytest.raises(TranscodeError, match=r"encode: vocabulary counts values over the 'train' split"):
        transcode(spec_path, str(tmp_path / "out"))


def test_command_line_prints_the_vocabulary_sizes(tmp_path):
    import subprocess
    import sys

    spec_path = write_dataset(tmp_path, rows=300)
    done = subprocess.run([sys.executable, "-m", "tf_dlrm.data.transcode", f"--input_spec={spec_path}",
                           f"--output_dir={tmp_path / 'out'}"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "train=300 samples, test=100 samples" in done.stdout
    assert "city: vocabulary of 10 values + OOV id 0 (vocabularies/cat_0_city.tsv)" in done.stdout
    bad = subprocess.run([sys.executable, "-m", "tf_dlrm.data.transcode", f"--input_spec={spec_path}",
                          f"--output_dir={tmp_path / 'out2'}", "--engine=local", "--block_lines=0"],
                         capture_output=True, text=True, check=False)
    assert bad.returncode != 0
