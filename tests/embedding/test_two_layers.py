"""Two DistributedEmbedding layers in one Keras model on 2, 3 and 4 ranks equal one process: the global
batch's logits before training within 1e-6, every table and dense weight after 10 fit() steps within
rtol 1e-5 (relative to max(|expected|, 1e-3)): only the order of float sums differs (the allreduce
and the sparse updates), about 10 steps of rounding at 2**-24 relative each."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import launch, run_python

WORKER = "tests/embedding/two_layers_worker.py"


def relative(actual, expected):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float((np.abs(actual - expected) / np.maximum(np.abs(expected), 1e-3)).max())


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    output = tmp_path_factory.mktemp("two_layers") / "np1.json"
    run_python([WORKER, f"--output={output}"], timeout=600)
    return json.loads(output.read_text())


@pytest.mark.multirank
@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_two_embedding_layers_on_n_ranks_equal_one_process(one_process, tmp_path, ranks):
    output = tmp_path / f"np{ranks}.json"
    launch(ranks, [WORKER, f"--output={output}"], timeout=600)
    many = json.loads(output.read_text())
    assert np.abs(np.asarray(many["logits"]) - np.asarray(one_process["logits"])).max() <= 1e-6
    assert set(many["tables"]) == {"users", "devices", "items", "brands"}
    assert min(one_process["moved"].values()) > 1e-4, f"training left a table unchanged: {one_process['moved']}"
    for name, expected in one_process["tables"].items():
        assert relative(many["tables"][name], expected) <= 1e-5, f"table {name} differs"
    # user tower kernel + bias, item tower kernel + bias, the model's own bias
    assert len(many["dense"]) == len(one_process["dense"]) == 5
    for index, (mine, theirs) in enumerate(zip(many["dense"], one_process["dense"])):
        assert relative(mine, theirs) <= 1e-5, f"dense weight {index} differs"
