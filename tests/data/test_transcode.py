"""CSV transcoder: round trips, every input error with file and line, nothing damaged on failure, CLI."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from tf_dlrm.data.csv_values import TranscodeError
from tf_dlrm.data.fractions import command_line_valid_fraction
from tf_dlrm.data.transcode import transcode
from tf_dlrm.spec.feature_spec import FeatureSpec
from tf_dlrm.spec.format import FeatureSpecError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Column order of the csv files; "extra" is defined but used by no channel, so it is skipped.
COLUMNS = ["click", "dense_a", "extra", "dense_b", "site", "user"]
CARDINALITIES = {"site": 4, "user": 300}


def _raw_spec(files: dict[str, list[str]], header: bool | None = None, delimiter: str | None = None) -> dict:
    sources = {}
    for split, names in files.items():
        chunk = {"type": "csv", "features": list(COLUMNS), "files": names}
        if header is not None:
            chunk["header"] = header
        if delimiter is not None:
            chunk["delimiter"] = delimiter
        sources[split] = [chunk]
    return {
        "feature_spec": {
            "click": {"dtype": "int8"}, "dense_a": {"dtype": "float32"}, "dense_b": {"dtype": "float32"},
            "extra": {"dtype": "float32"},
            "site": {"dtype": "int64", "cardinality": CARDINALITIES["site"]},
            "user": {"dtype": "int64", "cardinality": CARDINALITIES["user"]},
        },
        "channel_spec": {"label": ["click"], "numerical": ["dense_a", "dense_b"], "categorical": ["site", "user"]},
        "source_spec": sources,
    }


def _rows(rng, count):
    return [
        [str(int(rng.random() < 0.3)), f"{rng.normal() * 50:.4f}", "junk", f"{rng.exponential(3):.3f}",
         str(rng.integers(0, 4)), str(rng.integers(0, 300))]
        for _ in range(count)
    ]


def _write_csv(path, rows, header=False, delimiter=","):
    lines = ([delimiter.join(COLUMNS)] if header else []) + [delimiter.join(row) for row in rows]
    path.write_text("\n".join(lines) + "\n")


def _write_spec(directory, raw) -> str:
    path = directory / "input.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _check_output(directory, split, rows):
    spec = FeatureSpec.load(str(directory / "feature_spec.yaml"))
    assert spec.split_files(split).num_samples == len(rows)
    base = directory / split
    np.testing.assert_array_equal(np.fromfile(base / "label.bin", np.bool_), [r[0] == "1" for r in rows])
    numerical = np.fromfile(base / "numerical.bin", np.float32).reshape(-1, 2)
    np.testing.assert_array_equal(numerical, np.array([[r[1], r[3]] for r in rows], dtype=np.float32))
    # feature names without ".bin" get file names cat_<index>_<name>.bin
    np.testing.assert_array_equal(np.fromfile(base / "cat_0_site.bin", np.int8), [int(r[4]) for r in rows])
    np.testing.assert_array_equal(np.fromfile(base / "cat_1_user.bin", np.int16), [int(r[5]) for r in rows])
    return spec


def _listing(directory):
    return {os.path.relpath(os.path.join(root, name), directory): open(os.path.join(root, name), "rb").read()
            for root, _, names in os.walk(directory) for name in names}


@pytest.mark.parametrize("header", [None, False, True])
def test_round_trip_two_splits_several_files(tmp_path, header):
    rng = np.random.default_rng(0)
    parts = [_rows(rng, 9), _rows(rng, 14), _rows(rng, 5)]
    for index, rows in enumerate(parts):
        _write_csv(tmp_path / f"part{index}.csv", rows, header=bool(header))
    raw = _raw_spec({"train": ["part0.csv", "part1.csv"], "test": ["part2.csv"]}, header=header)
    out = tmp_path / "binary"
    written = transcode(_write_spec(tmp_path, raw), str(out), block_lines=4)  # blocks cross file ends
    _check_output(out, "train", parts[0] + parts[1])
    spec = _check_output(out, "test", parts[2])
    assert spec.dtype("site") == np.int8 and spec.dtype("user") == np.int16 and spec.dtype("click") == np.bool_
    assert written.metadata["num_samples"] == {"train": 23, "test": 5}
    assert not any(name.endswith(".partial") for name in _listing(out))


def test_tab_delimiter_and_crlf_lines(tmp_path):
    rows = _rows(np.random.default_rng(1), 6)
    (tmp_path / "data.tsv").write_bytes(("\r\n".join("\t".join(row) for row in rows) + "\r\n").encode())
    raw = _raw_spec({"train": ["data.tsv"]}, delimiter="\t")
    transcode(_write_spec(tmp_path, raw), str(tmp_path / "out"))
    _check_output(tmp_path / "out", "train", rows)


# (column, bad cell, fragment of the message)
BAD_CELLS = [
    (1, "", "missing value in column 2 ('dense_a')"),
    (3, "  ", "missing value in column 4 ('dense_b')"),
    (1, "abc", "column 2 ('dense_a'): 'abc' is not a number"),
    (1, "inf", "not a finite number"),
    (3, "1e39", "1e+39 overflows the feature's dtype float32"),
    (0, "", "missing value in column 1 ('click')"),
    (0, "2", "label must be 0 or 1"),
    (0, "yes", "'yes' is not a number"),
    (4, "x1", "categorical id 'x1' is not an integer"),
    (5, "3.5", "categorical id '3.5' is not an integer"),
    (5, "300", "categorical id 300 is outside [0, 300)"),
    (4, "-1", "categorical id -1 is outside [0, 4)"),
    (5, "", "missing value in column 6 ('user')"),
]


@pytest.mark.parametrize("header", [False, True])
@pytest.mark.parametrize("column,cell,fragment", BAD_CELLS)
def test_bad_cell_names_file_line_and_column(tmp_path, column, cell, fragment, header):
    rows = _rows(np.random.default_rng(2), 11)
    rows[9][column] = cell
    _write_csv(tmp_path / "good.csv", _rows(np.random.default_rng(3), 3), header=header)
    _write_csv(tmp_path / "bad.csv", rows, header=header)
    raw = _raw_spec({"train": ["good.csv"], "test": ["good.csv", "bad.csv"]}, header=header)
    with pytest.raises(TranscodeError) as caught:
        transcode(_write_spec(tmp_path, raw), str(tmp_path / "out"), block_lines=4)
    line = 10 + int(header)  # mid-block with block_lines=4; numbering restarts per file
    assert f"{tmp_path / 'bad.csv'}, line {line}: " in str(caught.value)
    assert fragment in str(caught.value)
    assert not (tmp_path / "out").exists()  # nothing half written, not even empty directories


@pytest.mark.parametrize("bad_line", ["1,2.0,x,3.0,1", "1,2.0,x,3.0,1,5,6", ""])
def test_wrong_number_of_columns(tmp_path, bad_line):
    rows = [",".join(row) for row in _rows(np.random.default_rng(4), 6)]
    rows.insert(4, bad_line)
    (tmp_path / "data.csv").write_text("\n".join(rows) + "\n")
    with pytest.raises(TranscodeError, match=r"data\.csv, line 5: expected 6 columns"):
        transcode(_write_spec(tmp_path, _raw_spec({"train": ["data.csv"]})), str(tmp_path / "out"))


def test_header_must_match_features(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("click,dense_a,extra,dense_b,user,site\n1,2,3,4,1,1\n")
    with pytest.raises(TranscodeError, match=r"data\.csv, line 1: the header names .*user', 'site'"):
        transcode(_write_spec(tmp_path, _raw_spec({"train": ["data.csv"]}, header=True)), str(tmp_path / "out"))


def test_a_header_only_csv_is_refused_naming_the_file(tmp_path):
    (tmp_path / "data.csv").write_text(",".join(COLUMNS) + "\n")
    with pytest.raises(TranscodeError) as refused:
        transcode(_write_spec(tmp_path, _raw_spec({"train": ["data.csv"]}, header=True)), str(tmp_path / "out"))
    assert str(refused.value) == (f"split 'train': {tmp_path / 'data.csv'} holds only a header line, no data rows. Expected "
                                  "at least one sample. Received: train=0 samples")
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []


def test_a_utf8_byte_order_mark_is_accepted(tmp_path):
    """Spreadsheet programs save "CSV UTF-8" with a byte-order mark before the header (or the first row)."""
    rows = _rows(np.random.default_rng(2), 6)
    for header in (True, False):
        lines = ([",".join(COLUMNS)] if header else []) + [",".join(row) for row in rows]
        (tmp_path / "data.csv").write_bytes(b"\xef\xbb\xbf" + ("\n".join(lines) + "\n").encode())
        out = tmp_path / f"out_{header}"
        transcode(_write_spec(tmp_path, _raw_spec({"train": ["data.csv"]}, header=header)), str(out))
        _check_output(out, "train", rows)


def test_failure_keeps_existing_dataset(tmp_path):
    rng = np.random.default_rng(5)
    good = _rows(rng, 7)
    _write_csv(tmp_path / "data.csv", good)
    spec_path = _write_spec(tmp_path, _raw_spec({"train": ["data.csv"], "test": ["data.csv"]}))
    out = tmp_path / "out"
    transcode(spec_path, str(out))
    before = _listing(out)
    bad = _rows(rng, 30)
    bad[25][5] = "7000"
    _write_csv(tmp_path / "data.csv", bad)  # train parses fully, test fails at its line 26
    with pytest.raises(TranscodeError, match=r"line 26: .*7000"):
        transcode(spec_path, str(out), block_lines=8)
    assert _listing(out) == before


def test_spec_level_errors(tmp_path):
    _write_csv(tmp_path / "data.csv", _rows(np.random.default_rng(6), 3))
    raw = _raw_spec({"train": ["data.csv"]})
    first = raw["source_spec"]["train"][0]
    # the split's features spread over two csv chunks: not supported
    raw["source_spec"]["train"] = [dict(first, features=["click", "dense_a", "site", "user"]), dict(first, features=["dense_b"])]
    with pytest.raises(TranscodeError, match=r"source_spec\.train: expected exactly one chunk of type 'csv'"):
        transcode(_write_spec(tmp_path, raw), str(tmp_path / "out"))
    missing = _raw_spec({"train": ["absent.csv"]})
    with pytest.raises(FeatureSpecError, match="absent.csv"):
        transcode(_write_spec(tmp_path, missing), str(tmp_path / "out"))
    bad_header = _raw_spec({"train": ["data.csv"]}, header="yes")
    with pytest.raises(TranscodeError, match="header: expected true or false"):
        transcode(_write_spec(tmp_path, bad_header), str(tmp_path / "out"))


def test_command_line(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rows = _rows(np.random.default_rng(7), 5)
    _write_csv(tmp_path / "data.csv", rows)
    spec_path = _write_spec(tmp_path, _raw_spec({"train": ["data.csv"]}))
    command = [sys.executable, "-m", "tf_dlrm.data.transcode", f"--input_spec={spec_path}", f"--output_dir={tmp_path / 'out'}"]
    completed = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    _check_output(tmp_path / "out", "train", rows)

    rows[2][0] = "5"
    _write_csv(tmp_path / "data.csv", rows)
    failed = subprocess.run(command[:-1] + [f"--output_dir={tmp_path / 'out2'}"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert failed.returncode != 0
    assert f"{tmp_path / 'data.csv'}, line 3:" in failed.stderr and "label must be 0 or 1" in failed.stderr
    assert not (tmp_path / "out2").exists()


def test_command_line_test_fraction_comes_with_a_validation_split(tmp_path):
    """On the command line --valid_fraction defaults to --test_fraction: a held-out test split always comes with a
    validation split to choose by (main.py never chooses by test); --valid_fraction=0 keeps the two splits."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rows = _rows(np.random.default_rng(5), 20)
    _write_csv(tmp_path / "data.csv", rows)
    spec_path = _write_spec(tmp_path, _raw_spec({"train": ["data.csv"]}))
    command = [sys.executable, "-m", "tf_dlrm.data.transcode", f"--input_spec={spec_path}", "--test_fraction=0.25"]
    three = subprocess.run(command + [f"--output_dir={tmp_path / 'three'}"], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=120)
    assert three.returncode == 0, three.stderr
    assert "train=10 samples, validation=5 samples, test=5 samples" in three.stdout
    _check_output(tmp_path / "three", "validation", rows[10:15])
    two = subprocess.run(command + ["--valid_fraction=0", f"--output_dir={tmp_path / 'two'}"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert two.returncode == 0, two.stderr
    assert "train=15 samples, test=5 samples" in two.stdout
    assert FeatureSpec.load(str(tmp_path / "two" / "feature_spec.yaml")).splits == ["train", "test"]


def test_command_line_valid_fraction():
    assert command_line_valid_fraction(None, 0.1) == 0.1 and command_line_valid_fraction(None, 0.0) == 0.0
    assert command_line_valid_fraction(0.0, 0.1) == 0.0 and command_line_valid_fraction(0.05, 0.1) == 0.05


def test_fractions_divide_the_train_split_in_row_order(tmp_path):
    """--valid_fraction / --test_fraction: train, validation, test by row order across files and
    blocks; a vocabulary counts only the rows left in train; other splits stay as they are."""
    rng = np.random.default_rng(3)
    parts = [_rows(rng, 13), _rows(rng, 27)]
    extra = _rows(rng, 4)
    for index, rows in enumerate(parts):
        _write_csv(tmp_path / f"part{index}.csv", rows, header=True)
    _write_csv(tmp_path / "extra.csv", extra, header=True)
    raw = _raw_spec({"train": ["part0.csv", "part1.csv"], "later": ["extra.csv"]}, header=True)
    out = tmp_path / "binary"
    written = transcode(_write_spec(tmp_path, raw), str(out), block_lines=5, valid_fraction=0.2, test_fraction=0.25)
    rows = parts[0] + parts[1]  # 40 rows: the last 10 test, the 8 before them validation
    _check_output(out, "train", rows[:22])
    _check_output(out, "validation", rows[22:30])
    spec = _check_output(out, "test", rows[30:])
    _check_output(out, "later", extra)
    assert spec.splits == ["train", "validation", "test", "later"]
    assert written.metadata["num_samples"] == {"train": 22, "validation": 8, "test": 10, "later": 4}
    assert written.metadata["split"] == {"rule": "fraction", "valid_fraction": 0.2, "test_fraction": 0.25}

    # A vocabulary-encoded column: ids by frequency over the 22 train rows only.
    raw["source_spec"]["train"][0]["encode"] = {"site": "vocabulary"}
    raw["source_spec"]["later"][0]["encode"] = {"site": "vocabulary"}
    del raw["feature_spec"]["site"]["cardinality"]
    for number, row in enumerate(rows):
        if number >= 22:
            row[4] = "9" if number < 30 else "7"  # values seen in validation and test only
    for index, part in enumerate(parts):
        _write_csv(tmp_path / f"part{index}.csv", part, header=True)
    encoded = transcode(_write_spec(tmp_path, raw), str(tmp_path / "encoded"), valid_fraction=0.2, test_fraction=0.25)
    vocabulary = (tmp_path / "encoded" / encoded.feature_spec["site"]["vocabulary"]).read_text().splitlines()
    values = {line.split("\t")[2] for line in vocabulary[2:]}
    assert values == {r[4] for r in rows[:22]}, vocabulary
    assert encoded.feature_spec["site"]["cardinality"] == len(values) + 1


def test_fraction_refusals(tmp_path):
    _write_csv(tmp_path / "data.csv", _rows(np.random.default_rng(1), 10))
    spec_path = _write_spec(tmp_path, _raw_spec({"train": ["data.csv"], "test": ["data.csv"]}))
    with pytest.raises(TranscodeError, match=r"already has the split\(s\) \['test'\]"):
        transcode(spec_path, str(tmp_path / "out"), test_fraction=0.1)
    with pytest.raises(ValueError, match=r"--valid_fraction must lie in \[0, 1 - test_fraction\)"):
        transcode(spec_path, str(tmp_path / "out"), valid_fraction=0.6, test_fraction=0.5)
    only_test = _write_spec(tmp_path, _raw_spec({"test": ["data.csv"]}))
    with pytest.raises(TranscodeError, match="divide the 'train' split, which source_spec lacks"):
        transcode(only_test, str(tmp_path / "out"), valid_fraction=0.1)
    assert not (tmp_path / "out").exists()
