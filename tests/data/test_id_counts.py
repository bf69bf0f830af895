"""Id counts: one pass over real split_binary files, stored next to the dataset, bad ids named."""

import os

import numpy as np
import pytest

from tf_dlrm.data import id_counts
from tf_dlrm.data.layout import nvidia_spec
from tf_dlrm.data.split_binary import SplitBinaryWriter

CARDINALITIES = [5, 200, 40000]


def _write(directory, categorical):
    spec = nvidia_spec(2, CARDINALITIES, splits=["train"], base_directory=str(directory))
    count = len(categorical[0])
    with SplitBinaryWriter(spec, "train") as writer:
        writer.append(np.zeros(count, bool), np.zeros((count, 2)), categorical)
    return spec


def test_counts_equal_bincount_and_are_stored_then_reused(tmp_path):
    rng = np.random.default_rng(0)
    categorical = [rng.integers(0, c, 1000) for c in CARDINALITIES]
    spec = _write(tmp_path, categorical)
    counts = id_counts.counts_for(spec)
    for name, ids, cardinality in zip(spec.categorical_features, categorical, CARDINALITIES):
        np.testing.assert_array_equal(counts[name], np.bincount(ids, minlength=cardinality))
    path = id_counts.counts_path(spec)
    assert os.path.dirname(path) == str(tmp_path)
    with np.load(path) as stored:
        assert int(stored[id_counts.SAMPLES_KEY]) == 1000
    # A stored file is read, not recounted: overwrite it with other counts and see them come back.
    changed = {name: np.zeros_like(value) for name, value in counts.items()}
    id_counts.save_counts(path, changed, 1000)
    assert all(not value.any() for value in id_counts.counts_for(spec).values())


def test_id_out_of_range_names_file_feature_and_position(tmp_path):
    spec = _write(tmp_path, [np.array([1, 2, 3]), np.array([0, 1, 2]), np.array([0, 1, 2])])
    path = spec.resolve("train/cat_0.bin")
    raw = np.fromfile(path, dtype=spec.dtype(spec.categorical_features[0]))
    raw[2] = 9
    raw.tofile(path)
    with pytest.raises(ValueError, match=r"cat_0.bin: value 2 of feature .* is id 9, outside \[0, 5\)"):
        id_counts.count_ids(spec)
    assert not os.path.exists(id_counts.counts_path(spec))


def test_stored_counts_of_wrong_size_are_refused(tmp_path):
    spec = _write(tmp_path, [np.array([1]), np.array([0]), np.array([0])])
    counts = id_counts.count_ids(spec)
    first = spec.categorical_features[0]
    counts[first] = counts[first][:-1]
    id_counts.save_counts(id_counts.counts_path(spec), counts, 1)
    with pytest.raises(ValueError, match=f"feature '{first}' have shape \\(4,\\), expected \\(5,\\)"):
        id_counts.counts_for(spec)


def test_command_line_writes_counts_and_prints_hot_rows(tmp_path):
    import subprocess
    import sys
    rng = np.random.default_rng(1)
    spec = _write(tmp_path, [rng.integers(0, c, 3000) for c in CARDINALITIES])
    spec.save(str(tmp_path / "feature_spec.yaml"))
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    result = subprocess.run([sys.executable, "-m", "tf_dlrm.data.id_counts", f"--spec={tmp_path}/feature_spec.yaml",
                             "--hot_rows_budget=0.05", "--world_size=2", "--dim=4"],
                            cwd=repo, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert os.path.exists(id_counts.counts_path(spec))
    assert "hot rows: budget 0.05" in result.stdout and "expected hit rate" in result.stdout
    bad = subprocess.run([sys.executable, "-m", "tf_dlrm.data.id_counts", f"--spec={tmp_path}/feature_spec.yaml",
                          "--hot_rows_budget=2"], cwd=repo, capture_output=True, text=True)
    assert bad.returncode != 0 and "hot_rows_budget" in bad.stderr
    # With the global batch, rows seen fewer than world_size times per batch stay cold: fewer hot rows.
    seen = subprocess.run([sys.executable, "-m", "tf_dlrm.data.id_counts", f"--spec={tmp_path}/feature_spec.yaml",
                           "--hot_rows_budget=0.05", "--world_size=2", "--dim=4", "--global_batch_size=100"],
                          cwd=repo, capture_output=True, text=True)
    assert seen.returncode == 0, seen.stderr

    def hot_rows(text):
        return sum(int(line.split(": ")[1].split()[0]) for line in text.splitlines() if "hot rows, expected" in line)
    assert hot_rows(seen.stdout) < hot_rows(result.stdout)
    zero = subprocess.run([sys.executable, "-m", "tf_dlrm.data.id_counts", f"--spec={tmp_path}/feature_spec.yaml",
                           "--global_batch_size=0", "--world_size=0"], cwd=repo, capture_output=True, text=True)
    assert zero.returncode != 0
