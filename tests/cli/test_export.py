"""The exported SavedModel serves with TensorFlow alone and predicts what the training model predicts."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

# checkpoint_runs (beside test_checkpoint.py) caches the launches these files share.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "checkpoint"))
from checkpoint_runs import STEPS, single, straight  # noqa: E402
from conftest import run_python  # noqa: E402

pytestmark = pytest.mark.multirank
_served: dict = {}


def served(tmp_path_factory) -> dict:
    """The export served once, by a fresh interpreter that never imports tf_dlrm (the script checks) and
    loads it with tf.saved_model.load: its scores of the first validation batch and its answers to wrong
    variants of that batch, read by the tests below."""
    if not _served:
        run = single(tmp_path_factory)
        directory = tmp_path_factory.mktemp("served")
        scores, report = str(directory / "served.npy"), str(directory / "bad.json")
        run_python(["tests/cli/serve_saved_model.py", run["saved_model"], os.path.join(run["out"], "predict_batch.npz"),
                    scores, report])
        _served.update(scores=scores, report=report)
    return _served


def test_saved_model_predicts_like_the_training_model(tmp_path_factory):
    run = single(tmp_path_factory)
    probabilities = np.load(served(tmp_path_factory)["scores"])
    one_process = np.load(os.path.join(run["out"], "predict_predictions.npy"))
    two_ranks = np.load(os.path.join(straight(tmp_path_factory)["out"], "predict_predictions.npy"))
    assert probabilities.shape == one_process.shape == (384,)
    np.testing.assert_allclose(probabilities, one_process, rtol=0, atol=1e-6)
    np.testing.assert_allclose(probabilities, two_ranks, rtol=0, atol=1e-6)


def test_saved_model_describes_its_inputs(tmp_path_factory):
    run = single(tmp_path_factory)
    with open(os.path.join(run["saved_model"], "tf_dlrm_serving.json")) as handle:
        info = json.load(handle)
    assert info["step"] == STEPS
    assert list(info["inputs"]) == ["numerical", *[f"cat_{i}_bin" for i in range(8)]]
    assert info["inputs"]["numerical"]["shape"] == [None, 13] and len(info["inputs"]["numerical"]["features"]) == 13
    for i in range(8):
        entry = info["inputs"][f"cat_{i}_bin"]
        assert entry["feature"] == f"cat_{i}.bin" and entry["shape"] == [None] and entry["dtype"] == "int64", entry
    assert info["outputs"] == {"probability": {"dtype": "float32", "shape": [None]}}
    assert run["results"]["export"]["step"] == STEPS


def test_export_never_overwrites_a_saved_model(tmp_path_factory):
    run = single(tmp_path_factory)
    assert "exists and is not empty" in run["results"]["export_again"]["error"]
    assert os.path.isfile(os.path.join(run["saved_model"], "saved_model.pb"))


def test_saved_model_refuses_a_wrong_batch_with_its_message(tmp_path_factory):
    """A signature checks dtypes, not shapes: without the served function's own asserts a second id per
    sample or a short numerical input could be sliced away and the batch scored. Loaded with TensorFlow
    alone. An id past its table is the embedding layer's refusal, naming the feature."""
    run = single(tmp_path_factory)
    with open(served(tmp_path_factory)["report"]) as handle:
        found = json.load(handle)
    with open(os.path.join(run["saved_model"], "tf_dlrm_serving.json")) as handle:
        cardinality = json.load(handle)["inputs"]["cat_2_bin"]["cardinality"]
    expected = {
        "cat_0_bin_two_ids": "serving input 'cat_0_bin': expected shape [batch] (int64 values of 'cat_0.bin'). Received "
                             "shape:] [384 2]",
        "numerical_12_columns": "serving input 'numerical': expected shape [batch, 13]",
        "cat_0_bin_batch_sizes_differ": "serving inputs 'numerical' and 'cat_0_bin' must hold the same number of samples "
                                        "(one row each). Received: 'numerical'] [384] [rows, 'cat_0_bin'] [383] [rows]",
        "cat_2_bin_id_outside": f"feature 'cat_2.bin': an id is outside [0, {cardinality})",
        "cat_5_bin_int32": "was expected to be a int64 tensor but is a int32 tensor",
        "numerical_float64": "was expected to be a float tensor but is a double tensor",
    }
    for case, fragment in expected.items():
        assert fragment in found[case], (case, found[case])
    assert "scored" not in found.values(), found  # the dtype cases too: none scored in silence


def test_a_triton_and_a_tf_serving_repository_hold_the_export(tmp_path_factory, tmp_path):
    """python -m tf_dlrm.cli.serving_repository: Triton's config.pbtxt describes the signature the SavedModel
    serves (names, types, full shapes), and the copies serve what the export serves."""
    run = single(tmp_path_factory)
    repository = tmp_path / "models"
    for layout, name in (("triton", "dlrm"), ("tf_serving", "dlrm_tfs")):
        completed = run_python(["-m", "tf_dlrm.cli.serving_repository", f"--saved_model_path={run['saved_model']}",
                                f"--repository={repository}", f"--name={name}", "--version=3", f"--layout={layout}"])
        assert f"wrote {layout} model {name!r} version 3" in completed.stdout
    info = json.loads(open(os.path.join(run["saved_model"], "tf_dlrm_serving.json")).read())["inputs"]
    config = (repository / "dlrm" / "config.pbtxt").read_text()
    assert config.startswith('name: "dlrm"\nplatform: "tensorflow_savedmodel"\nmax_batch_size: 0\n'), config
    for input_name, described in info.items():
        dims = ", ".join("-1" if size is None else str(size) for size in described["shape"])
        kind = {"float32": "TYPE_FP32", "int64": "TYPE_INT64"}[described["dtype"]]
        assert f'    name: "{input_name}"\n    data_type: {kind}\n    dims: [ {dims} ]' in config, config
    assert '    name: "probability"\n    data_type: TYPE_FP32\n    dims: [ -1 ]' in config, config
    batch = os.path.join(run["out"], "predict_batch.npz")
    expected = served(tmp_path_factory)["scores"]
    copies = [repository / "dlrm" / "3" / "model.savedmodel", repository / "dlrm_tfs" / "3"]
    scores = [str(tmp_path / f"{copy.parent.parent.name}.npy") for copy in copies]
    # Both copies in one fresh interpreter, each loaded on its own.
    run_python(["tests/cli/serve_saved_model.py", str(copies[0]), batch, scores[0], "--", str(copies[1]), batch, scores[1]])
    for copy_scores in scores:
        np.testing.assert_array_equal(np.load(copy_scores), np.load(expected))
    refused = run_python(["-m", "tf_dlrm.cli.serving_repository", f"--saved_model_path={tmp_path}",
                          f"--repository={repository}", "--name=x"], check=False)
    assert refused.returncode == 2 and f"--saved_model_path={tmp_path} holds no saved_model.pb" in refused.stderr
