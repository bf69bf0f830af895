"""``preprocessing/prepare_dataset.sh RAW_DIR OUTPUT_DIR``: raw Criteo files in, the same split_binary dataset
out as ``preprocessing.criteo`` with the script's defaults (days in day order, threshold 3), run from any directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, worker_env
from criteo_reference import copy_days, files_of
from preprocessing.criteo import PreprocessConfig, preprocess
from tf_dlrm.spec.feature_spec import FeatureSpec

SCRIPT = os.path.join(REPO, "preprocessing", "prepare_dataset.sh")


def prepare(raw_dir, output_dir, *flags, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", SCRIPT, str(raw_dir), str(output_dir), *flags], cwd=cwd,
                          env=worker_env({"PYTHON": sys.executable}), capture_output=True, text=True, timeout=300)


def test_days_in_day_order_match_the_module_with_the_same_settings(tmp_path, generated_criteo):
    raw = tmp_path / "raw"
    raw.mkdir()
    # day_10 before day_2 in a plain sort: the script must pass them in day order.
    layout = {"day_0": (0, 300), "day_2": (300, 500), "day_10": (500, 800), "day_23": (800, 1000)}
    paths = copy_days(generated_criteo.tsv, str(raw), layout, gzip_names=("day_2",))
    (raw / "notes.txt").write_text("not a day file\n")
    done = prepare("raw", "out", "--num_workers=1", cwd=tmp_path)  # relative paths, from outside the checkout
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["rows"] == {"train": 800, "test": 100, "validation": 100}

    preprocess(PreprocessConfig(inputs=tuple(paths), output_dir=str(tmp_path / "reference"), frequency_threshold=3,
                                split="days", num_workers=1))
    assert files_of(str(tmp_path / "out")) == files_of(str(tmp_path / "reference"))
    assert FeatureSpec.load(str(tmp_path / "out" / "feature_spec.yaml")).metadata["frequency_threshold"] == 3


def test_kaggle_train_txt_gets_three_splits_and_flags_win(tmp_path, generated_criteo):
    raw = tmp_path / "raw"
    raw.mkdir()
    os.symlink(generated_criteo.tsv, raw / "train.txt")
    done = prepare(raw, tmp_path / "out", "--frequency_threshold=1", "--num_workers=1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    spec = FeatureSpec.load(str(tmp_path / "out" / "feature_spec.yaml"))
    assert spec.splits == ["train", "validation", "test"]
    assert [spec.split_files(split).num_samples for split in spec.splits] == [800, 100, 100]
    assert spec.metadata["frequency_threshold"] == 1


@pytest.mark.parametrize("arguments, message", [
    ([], "usage: "),
    (["{raw}"], "usage: "),
    (["{raw}/missing", "{out}"], "RAW_DIR is not a directory: "),
    (["{raw}", "{out}"], "expected day_0 .. day_23 (plain or .gz) or train.txt in RAW_DIR"),
])
def test_bad_arguments_are_refused_with_a_reason(tmp_path, arguments, message):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "day_x").write_text("")
    command = ["bash", SCRIPT] + [a.format(raw=tmp_path / "raw", out=tmp_path / "out") for a in arguments]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()
