"""``python -m tf_dlrm.data.check``: one scan reports every problem of a dataset, and a clean one passes."""

from __future__ import annotations

import os

from conftest import run_python
from tiny_dataset import poke_id, poke_numerical, write_tiny


def test_clean_dataset_passes(tmp_path):
    data = write_tiny(tmp_path / "data")
    completed = run_python(["-m", "tf_dlrm.data.check", f"--dataset_path={data}"])
    assert "train: ok, test: ok" in completed.stdout


def test_every_problem_is_reported(tmp_path):
    data = write_tiny(tmp_path / "data")
    poke_id(data, "train", 0, 5, 3)
    poke_id(data, "train", 0, 1500, -2)
    poke_id(data, "train", 1, 9, 5000)
    poke_numerical(data, "train", 77, 3, float("inf"))
    poke_numerical(data, "train", 78, 3, float("nan"))
    with open(os.path.join(data, "test", "cat_1.bin"), "ab") as handle:
        handle.write(b"\x00")  # one byte too many for int16 ids
    completed = run_python(["-m", "tf_dlrm.data.check", f"--dataset_path={data}", "--block_samples=1000"], check=False)
    lines = completed.stdout.splitlines()
    assert completed.returncode == 1, completed.stdout + completed.stderr
    expected = [
        f"split 'train', feature 'cat_0.bin', file {data}/train/cat_0.bin: 2 id(s) outside [0, 3), the first at sample 5",
        f"split 'train', feature 'cat_1.bin', file {data}/train/cat_1.bin: 1 id(s) outside [0, 5000), the first at sample 9",
        f"split 'train', feature 'num_3', file {data}/train/numerical.bin: 2 NaN or inf value(s), the first at sample 77",
        f"split 'test': file {data}/test/cat_1.bin has 1025 bytes, not a whole number of 2-byte records "
        "(features ['cat_1.bin']); it may be truncated",
    ]
    for line in expected:
        assert line in lines, completed.stdout
    assert lines[-1].endswith("train: 3 problem(s), test: 1 problem(s)"), completed.stdout


def test_multi_hot_ids_are_checked_per_sample():
    """A multi-hot feature's ids come as ``[n, hotness]``: the first bad sample is named, not a flat index."""
    import numpy as np

    from tf_dlrm.data.validation import id_problem

    ids = np.array([[0, 1, 2], [2, 2, 2], [1, 7, 0], [3, -1, 0]], np.int32)
    assert id_problem(ids[:2], 3, first_sample=10) is None
    assert id_problem(ids, 3, first_sample=10) == "sample 12 has id 7 outside [0, 3) (2 such sample(s) among samples 10..13)"
