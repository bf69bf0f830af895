"""``python -m tf_dlrm.data.check``: one scan reports every problem of a dataset, and a clean one passes."""

from __future__ import annotations

import os

from conftest import run_python
from tiny_dataset import poke_id, poke_label, poke_numerical, write_tiny


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
    poke_label(data, "train", 600, 2)
    poke_label(data, "train", 1900, 255)
    poke_label(data, "test", 3, 255)
    with open(os.path.join(data, "test", "cat_1.bin"), "ab") as handle:
        handle.write(b"\x00")  # one byte too many for int16 ids
    completed = run_python(["-m", "tf_dlrm.data.check", f"--dataset_path={data}", "--block_samples=1000"], check=False)
    lines = completed.stdout.splitlines()
    assert completed.returncode == 1, completed.stdout + completed.stderr
    expected = [
        f"split 'train', feature 'cat_0.bin', file {data}/train/cat_0.bin: 2 id(s) outside [0, 3), the first at sample 5",
        f"split 'train', feature 'cat_1.bin', file {data}/train/cat_1.bin: 1 id(s) outside [0, 5000), the first at sample 9",
        f"split 'train', feature 'num_3', file {data}/train/numerical.bin: 2 NaN or inf value(s), the first at sample 77",
        # Read as bool, bytes 2 and 255 are True: the label file must be read as bytes to see them.
        f"split 'train', feature 'label', file {data}/train/label.bin: 2 label(s) not 0 or 1, the first at sample 600 "
        "holding 2",
        f"split 'test': file {data}/test/cat_1.bin has 1025 bytes, not a whole number of 2-byte records "
        "(features ['cat_1.bin']); it may be truncated",
    ]
    for line in expected:
        assert line in lines, completed.stdout
    assert lines[-1].endswith("train: 4 problem(s), test: 1 problem(s)"), completed.stdout
    # The test split's sizes disagree, so its values are not read; the label check is proved alone below.


def test_a_label_byte_other_than_0_or_1_fails_the_check(tmp_path):
    for byte in (2, 255):
        data = write_tiny(tmp_path / f"data_{byte}")
        poke_label(data, "test", 3, byte)
        completed = run_python(["-m", "tf_dlrm.data.check", f"--dataset_path={data}"], check=False)
        assert completed.returncode == 1, completed.stdout + completed.stderr
        assert completed.stdout.splitlines() == [
            f"split 'test', feature 'label', file {data}/test/label.bin: 1 label(s) not 0 or 1, the first at sample 3 "
            f"holding {byte}",
            f"checked {data}/feature_spec.yaml: train: ok, test: 1 problem(s)",
        ], completed.stdout


def test_label_problem_names_the_first_bad_sample_and_value():
    import numpy as np

    from tf_dlrm.data.validation import label_problem, raw_label_dtype

    raw = np.array([0, 1, 1, 255, 0, 2], np.uint8)
    assert raw_label_dtype("bool") == np.uint8 and raw_label_dtype("float32") == np.float32
    assert label_problem(raw[:3], first_sample=40) is None
    assert label_problem(raw, first_sample=40) == (
        "sample 43 has label 255; expected 0 or 1 (2 such sample(s) among samples 40..45)")
    # The reader's float32 labels: integral values print as integers, fractions as they are.
    assert label_problem(raw.astype(np.float32), first_sample=0).startswith("sample 3 has label 255;")
    assert label_problem(np.array([[1.0], [0.5]], np.float32), first_sample=0).startswith("sample 1 has label 0.5;")


def test_multi_hot_ids_are_checked_per_sample():
    """A multi-hot feature's ids come as ``[n, hotness]``: the first bad sample is named, not a flat index."""
    import numpy as np

    from tf_dlrm.data.validation import id_problem

    ids = np.array([[0, 1, 2], [2, 2, 2], [1, 7, 0], [3, -1, 0]], np.int32)
    assert id_problem(ids[:2], 3, first_sample=10) is None
    assert id_problem(ids, 3, first_sample=10) == "sample 12 has id 7 outside [0, 3) (2 such sample(s) among samples 10..13)"
