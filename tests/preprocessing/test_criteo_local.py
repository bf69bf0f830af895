"""The local engine against an independent reference, on both shared samples."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from criteo_reference import (
    Reference,
    assert_split_equal,
    copy_days,
    files_of,
    fraction_split,
    read_rows,
    read_split,
)
from preprocessing.criteo import PreprocessConfig, preprocess
from preprocessing.criteo_format import CriteoFormatError
from preprocessing.vocabulary import Vocabulary
from tf_dlrm.spec.feature_spec import FeatureSpec

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_local(inputs, output_dir, **settings) -> dict:
    settings.setdefault("num_workers", 2)
    return preprocess(PreprocessConfig(inputs=tuple(inputs), output_dir=str(output_dir), **settings))


@pytest.mark.parametrize(
    "layout, threshold, test_fraction",
    [("tsv", 3, 0.1), ("csv", 2, 0.25), ("tsv", 1, 0.0)],
    ids=["tsv_1tb_t3", "csv_kaggle_t2", "tsv_1tb_t1_no_test"],
)
def test_matches_independent_reference(tmp_path, criteo, layout, threshold, test_fraction):
    sample = getattr(criteo, layout)
    report = run_local([sample], tmp_path / "out", frequency_threshold=threshold, test_fraction=test_fraction)
    rows, header = read_rows(sample)
    reference = Reference(rows, fraction_split(len(rows), test_fraction), threshold)

    spec = FeatureSpec.load(str(tmp_path / "out" / "feature_spec.yaml"))
    assert spec.cardinalities() == reference.cardinalities
    assert report["cardinalities"] == reference.cardinalities
    assert spec.splits == ["train", "test"]
    assert spec.metadata["frequency_threshold"] == threshold
    for split in ("train", "test"):
        expected = reference.split(split)
        assert spec.split_files(split).num_samples == len(expected["label"]) == report["rows"][split]
        assert_split_equal(read_split(str(tmp_path / "out"), split, reference.cardinalities), expected, split)
    assert report["inputs"][0]["format"] == ("csv" if header else "tsv")
    assert report["bad_rows"]["total"] == 0


def test_three_splits_by_fraction_match_the_reference(tmp_path, criteo):
    """train, then validation, then test, by row order; the vocabulary counts the train rows only."""
    report = run_local([criteo.csv], tmp_path / "out", frequency_threshold=2, test_fraction=0.2, valid_fraction=0.15)
    rows, _ = read_rows(criteo.csv)
    num_test, num_valid = int(np.floor(len(rows) * 0.2 + 0.5)), int(np.floor(len(rows) * 0.15 + 0.5))
    first_valid, first_test = len(rows) - num_test - num_valid, len(rows) - num_test
    reference = Reference(
        rows, lambda number: "train" if number < first_valid else "validation" if number < first_test else "test", 2)
    spec = FeatureSpec.load(str(tmp_path / "out" / "feature_spec.yaml"))
    assert spec.splits == ["train", "validation", "test"]
    assert spec.cardinalities() == reference.cardinalities
    for split in ("train", "validation", "test"):
        expected = reference.split(split)
        assert len(expected["label"]) > 0
        assert spec.split_files(split).num_samples == len(expected["label"]) == report["rows"][split]
        assert_split_equal(read_split(str(tmp_path / "out"), split, reference.cardinalities), expected, split)


def test_thresholding_and_tie_breaking(tmp_path):
    """Hand-made counts: ids follow descending count, ties by hash ascending; rare and unseen share id 1."""
    base = ["0"] + ["1"] * 13 + ["0000000a"] * 26
    train_values = ["000000ff"] * 3 + ["00000010"] * 2 + ["0000000f"] * 2 + ["00000001"] + [""] * 2
    lines = []
    for value in train_values:
        row = list(base)
        row[14] = value
        lines.append("\t".join(row))
    test_row = list(base)
    test_row[14] = "00000002"  # unseen in training
    lines.append("\t".join(test_row))
    path = tmp_path / "tiny.tsv"
    path.write_text("\n".join(lines) + "\n")
    run_local([str(path)], tmp_path / "out", frequency_threshold=2, test_fraction=1 / 11)
    vocabulary = Vocabulary.load(str(tmp_path / "out" / "vocabulary"), 26)
    assert vocabulary.values[0].tolist() == [0xFF, 0x0F, 0x10]  # 3, then the two 2s by hash
    assert vocabulary.counts[0].tolist() == [3, 2, 2]
    ids = np.fromfile(tmp_path / "out" / "train" / "cat_0.bin", dtype=np.int8)
    assert ids.tolist() == [2, 2, 2, 4, 4, 3, 3, 1, 0, 0]
    assert np.fromfile(tmp_path / "out" / "test" / "cat_0.bin", dtype=np.int8).tolist() == [1]
    assert yaml.safe_load((tmp_path / "out" / "feature_spec.yaml").read_text())["feature_spec"]["cat_0.bin"]["cardinality"] == 5


def test_days_split_gzip_and_small_blocks(tmp_path, criteo):
    """day_0..day_1 train (one gzipped), day_23 halves test/validation; many small blocks."""
    layout = {"day_0": (0, 500), "day_1": (500, 800), "day_23": (800, 1000)}
    paths = copy_days(criteo.tsv, str(tmp_path), layout, gzip_names=("day_1",))
    report = run_local(paths, tmp_path / "out", frequency_threshold=2, split="days", block_bytes=8192)
    rows, _ = read_rows(criteo.tsv)
    reference = Reference(rows, lambda n: "train" if n < 800 else ("test" if n < 900 else "validation"), 2)
    assert report["rows"] == {"train": 800, "test": 100, "validation": 100}
    spec = FeatureSpec.load(str(tmp_path / "out" / "feature_spec.yaml"))
    assert spec.splits == ["train", "test", "validation"]
    assert spec.cardinalities() == reference.cardinalities
    for split in ("train", "test", "validation"):
        assert_split_equal(read_split(str(tmp_path / "out"), split, reference.cardinalities), reference.split(split), split)
    assert report["inputs"][1]["compressed"] is True


@pytest.mark.slow  # five full runs of the engine; the unit tier keeps the other format tests
def test_block_size_gzip_and_line_endings_do_not_change_output(tmp_path, criteo):
    run_local([criteo.tsv], tmp_path / "plain", frequency_threshold=2)
    data = open(criteo.tsv, "rb").read()
    with gzip.open(tmp_path / "sample.tsv.gz", "wb") as stream:
        stream.write(data)
    (tmp_path / "crlf.tsv").write_bytes(data.replace(b"\n", b"\r\n"))
    run_local([str(tmp_path / "sample.tsv.gz")], tmp_path / "gz", frequency_threshold=2, block_bytes=4096)
    run_local([str(tmp_path / "crlf.tsv")], tmp_path / "crlf", frequency_threshold=2, block_bytes=5000)
    # Only the input file names recorded in the spec and the report may differ.
    skip = ("preprocess_report.json", "feature_spec.yaml")
    expected = {k: v for k, v in files_of(str(tmp_path / "plain")).items() if k not in skip}
    expected_spec = yaml.safe_load((tmp_path / "plain" / "feature_spec.yaml").read_text())
    for name in ("gz", "crlf"):
        actual = {k: v for k, v in files_of(str(tmp_path / name)).items() if k not in skip}
        assert actual.keys() == expected.keys()
        assert [k for k in expected if actual[k] != expected[k]] == []
        spec = yaml.safe_load((tmp_path / name / "feature_spec.yaml").read_text())
        spec["metadata"]["inputs"] = expected_spec["metadata"]["inputs"]
        assert spec == expected_spec


def test_vocab_dir_transforms_new_days_with_the_same_ids(tmp_path, criteo):
    paths = copy_days(criteo.tsv, str(tmp_path), {"day_0": (0, 700), "day_5": (700, 1000)})
    run_local(paths[:1], tmp_path / "first", frequency_threshold=2, split="none")
    report = run_local(paths[1:], tmp_path / "second", split="none", vocab_dir=str(tmp_path / "first" / "vocabulary"))
    rows, _ = read_rows(criteo.tsv)
    reference = Reference(rows, lambda n: "train" if n < 700 else "later", 2)
    assert report["cardinalities"] == reference.cardinalities
    assert report["training_rows_counted"] is None
    assert_split_equal(read_split(str(tmp_path / "second"), "train", reference.cardinalities), reference.split("later"), "day_5")
    with pytest.raises(ValueError, match="frequency_threshold=5 differs"):
        run_local(paths[1:], tmp_path / "third", split="none", frequency_threshold=5, vocab_dir=str(tmp_path / "first" / "vocabulary"))


@pytest.mark.parametrize(
    "content, message",
    [
        (b"hello world\n", "neither tabs nor commas"),
        (b'{"label": 1, "I1": 3}\n', "must be the Criteo header"),
        (b"a,b,c\n1,2,3\n", "must be the Criteo header"),
        (b"1\t2\t3\n0\t5\t6\n", "none of the first 2 data lines is a valid row"),
        (b"", "empty"),
    ],
    ids=["text", "json", "other_header", "three_columns", "empty"],
)
def test_not_criteo_shaped_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "input.txt"
    path.write_bytes(content)
    with pytest.raises(CriteoFormatError, match=message) as error:
        run_local([str(path)], tmp_path / "out")
    assert str(path) in str(error.value)


def test_failed_run_leaves_existing_output_untouched(tmp_path, generated_criteo):
    run_local([generated_criteo.tsv], tmp_path / "out", frequency_threshold=2)
    before = files_of(str(tmp_path / "out"))
    bad = tmp_path / "bad.tsv"
    bad.write_bytes(b"not\tcriteo\n")
    with pytest.raises(CriteoFormatError):
        run_local([str(bad)], tmp_path / "out")
    assert files_of(str(tmp_path / "out")) == before
    assert sorted(os.listdir(tmp_path)) == ["bad.tsv", "out"]  # no temporary directory left behind
    # A successful run replaces the earlier output.
    run_local([generated_criteo.csv], tmp_path / "out", frequency_threshold=1)
    assert json.loads((tmp_path / "out" / "preprocess_report.json").read_text())["inputs"][0]["format"] == "csv"
    assert sorted(os.listdir(tmp_path)) == ["bad.tsv", "out"]


def test_refuses_to_replace_a_foreign_directory(tmp_path, generated_criteo):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="refusing to replace"):
        run_local([generated_criteo.tsv], tmp_path / "out")
    assert (tmp_path / "out" / "precious.txt").read_text() == "keep me"


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"engine": "dask"}, "--engine must be one of"),
        ({"split": "random"}, "--split must be one of"),
        ({"test_fraction": 1.0}, "--test_fraction must lie in"),
        ({"frequency_threshold": -1}, "--frequency_threshold must be >= 0"),
        ({"test_fraction": 0.5, "valid_fraction": 0.5}, r"--valid_fraction must lie in \[0, 1 - test_fraction\)"),
        ({"split": "days", "valid_fraction": 0.1}, "--valid_fraction applies to --split=fraction only"),
    ],
)
def test_config_errors_name_the_flag(tmp_path, settings, message, generated_criteo):
    with pytest.raises(ValueError, match=message):
        PreprocessConfig(inputs=(generated_criteo.tsv,), output_dir=str(tmp_path / "out"), **settings)


def test_days_split_needs_day_names(tmp_path, generated_criteo):
    with pytest.raises(ValueError, match="--split=days expects files named day_0"):
        run_local([generated_criteo.tsv], tmp_path / "out", split="days")


def test_command_line(tmp_path, generated_criteo):
    command = [
        sys.executable, "-m", "preprocessing.criteo", f"--input={generated_criteo.csv}", f"--output_dir={tmp_path / 'out'}",
        "--frequency_threshold=2", "--test_fraction=0.2", "--num_workers=2",
    ]
    result = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    # A held-out test split comes with a validation split of the same share (--valid_fraction's default).
    assert summary["rows"] == {"train": 120, "validation": 40, "test": 40}
    FeatureSpec.load(str(tmp_path / "out" / "feature_spec.yaml"), check_files=True)
    missing = subprocess.run(
        [sys.executable, "-m", "preprocessing.criteo", f"--input={tmp_path / 'nope.tsv'}", f"--output_dir={tmp_path / 'x'}"],
        cwd=REPOSITORY, capture_output=True, text=True, timeout=120,
    )
    assert missing.returncode != 0 and "file not found" in missing.stderr


@pytest.mark.parametrize("sizes", [(40, 0, 35, 25), (100,), (5, 5, 5, 85)])
def test_fraction_plan_across_files_follows_the_row_order(sizes):
    """Boundaries falling inside files, on file edges and across an empty file: every data line's
    split is the one its position in the whole sequence gives."""
    from preprocessing.criteo_format import InputFormat
    from preprocessing.splits import InputFile, make_plan

    files = [InputFile(i, f"f{i}", False, InputFormat(b"\t", False), n) for i, n in enumerate(sizes)]
    plan = make_plan(files, "fraction", test_fraction=0.2, valid_fraction=0.15)
    assert plan.names == ("train", "validation", "test") and plan.metadata()["valid_fraction"] == 0.15
    total = sum(sizes)
    expected = np.array([0] * (total - 20 - 15) + [1] * 15 + [2] * 20, np.int8)
    actual = np.concatenate([plan.split_of(i, 0, n) for i, n in enumerate(sizes)])
    np.testing.assert_array_equal(actual, expected)
    two = make_plan(files, "fraction", test_fraction=0.2)
    assert two.names == ("train", "test") and "valid_fraction" not in two.metadata()
    np.testing.assert_array_equal(np.concatenate([two.split_of(i, 0, n) for i, n in enumerate(sizes)]),
                                  np.array([0] * (total - 20) + [1] * 20, np.int8))
