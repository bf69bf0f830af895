"""examples/custom_model.py: a DeepFM-like Keras model trained with model.fit on 2 ranks equals one
process: full tables and dense weights (the wide part outside any MLP included) within rtol 1e-5
(relative to max(|expected|, 1e-3)): only the order of float sums differs (the allreduce and the
sparse updates), about 30 steps of rounding at 2**-24 relative each."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import launch, run_python

ARGS = ["examples/custom_model.py", "--steps=12", "--global_batch=32"]


def relative(actual, expected):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float((np.abs(actual - expected) / np.maximum(np.abs(expected), 1e-3)).max())


@pytest.mark.multirank
def test_fit_on_two_ranks_equals_one_process(tmp_path):
    single, double = tmp_path / "np1.json", tmp_path / "np2.json"
    run_python(ARGS + [f"--output={single}"], timeout=600)
    launch(2, ARGS + [f"--output={double}"], timeout=600)
    one, two = json.loads(single.read_text()), json.loads(double.read_text())
    assert one["tables_moved"] > 1e-3, "training did not change the tables"
    for name in one["tables"]:
        assert relative(two["tables"][name], one["tables"][name]) <= 1e-5, f"table {name} differs"
    # The deep part's 2 kernels and 2 biases and the wide part's kernel and bias (outside any MLP).
    assert len(one["dense"]) == len(two["dense"]) == 6
    for index, (mine, theirs) in enumerate(zip(two["dense"], one["dense"])):
        assert relative(mine, theirs) <= 1e-5, f"dense weight {index} differs"
