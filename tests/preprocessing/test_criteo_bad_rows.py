"""Bad rows are skipped and counted exactly; --strict stops at the first with its file and line."""

from __future__ import annotations

import json

import pytest

from criteo_reference import (
    Reference,
    assert_split_equal,
    corrupt_copy,
    fraction_split,
    read_rows,
    read_split,
)
from preprocessing.criteo import PreprocessConfig, preprocess
from preprocessing.criteo_format import BadRowError


def run_local(inputs, output_dir, **settings) -> dict:
    return preprocess(PreprocessConfig(inputs=tuple(inputs), output_dir=str(output_dir), num_workers=2, **settings))


def test_report_counts_are_exact(tmp_path, criteo):
    corrupted = tmp_path / "corrupted.tsv"
    bad_lines = corrupt_copy(criteo.tsv, str(corrupted))
    report = run_local([str(corrupted)], tmp_path / "out", frequency_threshold=2, block_bytes=16384)

    on_disk = json.loads((tmp_path / "out" / "preprocess_report.json").read_text())
    assert on_disk == report
    by_reason = report["bad_rows"]["by_reason"]
    assert {reason: entry["count"] for reason, entry in by_reason.items()} == {
        reason: len(lines) for reason, lines in bad_lines.items()
    }
    assert report["bad_rows"]["total"] == 6
    for reason, lines in bad_lines.items():
        assert [entry["line"] for entry in by_reason[reason]["first"]] == lines
        assert all(entry["file"] == str(corrupted) for entry in by_reason[reason]["first"])
    assert by_reason["wrong_field_count"]["first"][0]["detail"] == "35 fields, expected 40"
    assert by_reason["wrong_field_count"]["first"][1]["detail"] == "1 fields, expected 40"
    assert by_reason["bad_integer"]["first"][0]["detail"] == "column I3: '12ab'"
    assert by_reason["bad_categorical"]["first"][0]["detail"] == "column C5: '012345678'"
    assert by_reason["bad_label"]["first"][0]["detail"] == "column label: '2'"

    # The split stays by line position (bad lines count); the valid rows are exactly the reference's.
    rows, _ = read_rows(str(corrupted))
    reference = Reference(rows, fraction_split(len(rows), 0.1), 2)
    assert sum(reference.reasons.values()) == 6
    assert report["rows"] == {"train": 895, "test": 99}
    assert report["cardinalities"] == reference.cardinalities
    for split in ("train", "test"):
        assert_split_equal(read_split(str(tmp_path / "out"), split, reference.cardinalities), reference.split(split), split)


def test_first_rows_listed_are_capped_and_ordered(tmp_path, generated_criteo):
    lines = open(generated_criteo.tsv).read().split("\n")
    for number in range(3, 60, 4):  # 15 truncated rows
        lines[number - 1] = "\t".join(lines[number - 1].split("\t")[:10])
    corrupted = tmp_path / "many.tsv"
    corrupted.write_text("\n".join(lines))
    report = run_local([str(corrupted)], tmp_path / "out", block_bytes=4096)
    entry = report["bad_rows"]["by_reason"]["wrong_field_count"]
    assert entry["count"] == 15
    assert [e["line"] for e in entry["first"]] == list(range(3, 60, 4))[:10]


def test_strict_stops_at_the_first_bad_row(tmp_path, criteo):
    corrupted = tmp_path / "corrupted.tsv"
    corrupt_copy(criteo.tsv, str(corrupted))
    (tmp_path / "out").mkdir()
    with pytest.raises(BadRowError, match=rf"^{corrupted}:10: wrong_field_count: 35 fields, expected 40"):
        run_local([str(corrupted)], tmp_path / "out", strict=True, block_bytes=16384)
    assert list((tmp_path / "out").iterdir()) == []


def test_strict_finds_bad_rows_outside_training(tmp_path, criteo):
    """A bad row only in the test part is found by the transform pass."""
    lines = open(criteo.tsv).read().split("\n")
    lines[979] = lines[979].replace("\t", "\tx", 1)  # line 980: I1 gets an "x" prefix
    corrupted = tmp_path / "late.tsv"
    corrupted.write_text("\n".join(lines))
    with pytest.raises(BadRowError, match=rf"{corrupted}:980: bad_integer: column I1"):
        run_local([str(corrupted)], tmp_path / "out", strict=True)


def test_csv_sample_with_a_fractional_integer(tmp_path, criteo):
    """In the Kaggle CSV, '260.0' is fine but '260.5' is not an integer."""
    text = open(criteo.csv).read()
    assert ",260.0," in text
    corrupted = tmp_path / "kaggle.csv"
    corrupted.write_text(text.replace(",260.0,", ",260.5,", 1))
    report = run_local([str(corrupted)], tmp_path / "out")
    entry = report["bad_rows"]["by_reason"]["bad_integer"]
    assert entry["count"] == 1
    assert entry["first"] == [{"file": str(corrupted), "line": 2, "detail": "column I3: '260.5'"}]
    assert report["rows"]["train"] + report["rows"]["test"] == 199
