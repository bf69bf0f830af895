"""The storage test: a run whose dataset, checkpoints, logs and export live on non-local storage, resumed.

TensorFlow's in-memory ``ram://`` filesystem stands for ``gs://`` / ``s3://`` / ``hdfs://`` (the same
``tf.io.gfile`` layer; no S3-compatible server with a plugin for this TensorFlow installs here: docs/storage.md).
``ram://`` lives inside one process, so ``tests/io/remote_storage_run.py`` runs main.py's train, resume,
eval and export command lines in one process (docstring there). What must hold:

- the first run saves steps 2 and 4 on ``ram://``; the resumed run restores step 4 from there and
  trains to 8, and its validation figures equal a straight 8-step run on the local copy of the data
  within 1e-6 (one process both times: the same float operations, so only the storage differs);
- retention deleted the older checkpoints on ``ram://`` (keep 2);
- the JSON-lines, DLLogger and TensorBoard logs were written there;
- the SavedModel exported to ``ram://`` loads back from there and scores the validation split with the
  trained model's AUC (within 1e-4: the SavedModel runs TensorFlow's ops where training ran tf_dlrm's
  kernels, so probabilities differ in the last bits and a near-tie may swap: one swapped pair of
  1500 samples moves the AUC by about 2.4e-6).
"""

from __future__ import annotations

import json
import os

import pytest

from conftest import REPO, run_python


def test_train_resume_and_export_on_remote_storage(tmp_path):
    from tf_dlrm.data.synthetic import generate
    from tf_dlrm.spec.feature_spec import FeatureSpec

    spec = FeatureSpec.load(os.path.join(REPO, "feature_specs", "synthetic_small.yaml"), check_files=False)
    data = str(tmp_path / "data")
    generate(spec, data, num_train_samples=1536, num_valid_samples=1500, seed=1)
    out = str(tmp_path / "out.json")
    completed = run_python(["tests/io/remote_storage_run.py", data, out], timeout=600)
    with open(out) as handle:
        result = json.load(handle)
    first, resumed, straight = result["first"], result["resumed"], result["straight"]
    print(f"\nfirst run: {first['steps']} steps, checkpoints saved at {result['saved_steps_first']}; resumed from step "
          f"{result['resumed_restored'][0]['step']} to {resumed['steps']} (saved {result['resumed_saved_steps']}); "
          f"AUC resumed {resumed['auc']:.6f}, straight {straight['auc']:.6f}, served from ram:// {result['served_auc']:.6f}")

    assert first["steps"] == 4 and result["saved_steps_first"] == [2, 4]
    assert result["checkpoints_after_first"] == ["ckpt-00000002", "ckpt-00000004", "latest"]
    restored = result["resumed_restored"]
    assert len(restored) == 1 and restored[0]["step"] == 4 and restored[0]["path"] == "ram://storage_test/ckpt/ckpt-00000004"
    assert resumed["steps"] == 8 and result["resumed_saved_steps"] == [6, 8]
    assert result["checkpoints_after_resume"] == ["ckpt-00000006", "ckpt-00000008", "latest"]
    assert "no file locks" in completed.stderr  # the one line about the unlocked remote directory
    for key in ("auc", "logloss"):
        assert resumed[key] == pytest.approx(straight[key], abs=1e-6)
        assert result["eval"][key] == pytest.approx(resumed[key], abs=1e-6)
    assert result["eval"]["checkpoint"] == "ram://storage_test/ckpt/ckpt-00000008"
    assert result["eval_dllogger_auc"] == [pytest.approx(result["eval"]["auc"], abs=1e-12)]
    assert len(result["tensorboard_files"]) == 1 and result["tensorboard_files"][0].startswith("events.out.tfevents")
    assert result["export"]["step"] == 8
    assert {"saved_model.pb", "variables", "tf_dlrm_serving.json", ".tf_dlrm_output.json"} <= set(result["export_files"])
    assert result["served_auc"] == pytest.approx(resumed["auc"], abs=1e-4)
