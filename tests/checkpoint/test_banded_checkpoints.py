"""Checkpoints of row-sliced tables (``--row_slice_threshold``): saved as their owners' row bands, resharded.

The checkpoint tests' model (row-wise Adagrad on the tables, Adam on the MLPs; synthetic_small's 3
model-parallel tables) trained 10 steps on ``-np 2`` with ``--row_slice_threshold=1``: every
model-parallel table is cut into 2 row bands. Its step-10 checkpoint must hold each table as two band
files and equal, within 1e-5, the step 10 of checkpoint_runs' ``straight`` run (``-np 2`` column-wise:
another plan of the same model, the same gradients summed in another order; 1e-5 as in
test_resume.py). Resumed from step 5 on ``-np 3`` (3 bands, other row boundaries, every band file read
across two saved bands), its step 10 equals the 2-rank one within 1e-5. One process restores the
banded checkpoint and predicts what its ``-np 2`` restore predicted (1e-6, as test_checkpoint.py's
restores on other plans), and exports it.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from checkpoint_runs import EVERY, STEPS, ckpt, dataset, max_difference, model_flags, run_worker, straight
from tf_dlrm.checkpoint import store as checkpoint_store

pytestmark = pytest.mark.multirank
ROWS = ["--row_slice_threshold=1", "--dist_strategy=table_wise"]


def test_row_bands_are_saved_as_bands_and_reshard_to_other_bands(tmp_path_factory):
    data = dataset(tmp_path_factory)
    out = str(tmp_path_factory.mktemp("row_bands"))
    save = os.path.join(out, "checkpoints")
    run_worker(2, [{"name": "train", "action": "train", "argv": model_flags(data) + ROWS + [
        f"--max_steps={STEPS}", f"--checkpoint_every_steps={EVERY}", f"--save_checkpoint_path={save}",
        f"--log_path={out}/train.jsonl"]},
        {"name": "predict", "action": "predict", "argv": model_flags(data) + ROWS + [f"--restore_checkpoint_path={ckpt(save, STEPS)}"]},
    ], out)
    manifest = checkpoint_store.read_manifest(ckpt(save, STEPS))
    banded = [entry for entry in manifest["tables"] if len(entry.get("slices", [])) > 1]
    assert len(banded) == 3, [entry.get("slices") for entry in manifest["tables"]]
    for entry in banded:
        half = entry["rows"] // 2
        assert [s["rows"] for s in entry["slices"]] == [[0, half], [half, entry["rows"]]]
        assert all(s["columns"] == [0, entry["dim"]] and ".rows_" in s["file"] for s in entry["slices"])
    state = [entry for entry in manifest["embedding_state"] if len(entry.get("slices", [])) > 1]
    assert len(state) == 3 and all(s["columns"] == [0, 1] for entry in state for s in entry["slices"])

    column_wise = straight(tmp_path_factory)
    difference, where = max_difference(ckpt(save, STEPS), ckpt(column_wise["save"], STEPS))
    print(f"2 row bands vs 2 column slices, step {STEPS}: largest difference {difference:.3g} in {where}")
    assert difference <= 1e-5, f"row bands vs column slices: largest difference {difference} in {where}"

    resumed_out = str(tmp_path_factory.mktemp("row_bands_np3"))
    resumed = os.path.join(resumed_out, "checkpoints")
    run_worker(3, [{"name": "train", "action": "train", "argv": model_flags(data) + ROWS + [
        f"--restore_checkpoint_path={ckpt(save, EVERY)}", f"--max_steps={STEPS}", f"--checkpoint_every_steps={EVERY}",
        f"--save_checkpoint_path={resumed}", f"--log_path={resumed_out}/train.jsonl"]}], resumed_out)
    thirds = checkpoint_store.read_manifest(ckpt(resumed, STEPS))["tables"]
    assert all(len({tuple(s["rows"]) for s in entry["slices"]}) == 3 for entry in thirds if entry.get("slices") and len(entry["slices"]) > 1)
    difference, where = max_difference(ckpt(resumed, STEPS), ckpt(save, STEPS))
    print(f"2 bands -> 3 bands from step {EVERY}, step {STEPS}: largest difference {difference:.3g} in {where}")
    assert difference <= 1e-5, f"2 bands -> 3 bands: largest difference {difference} in {where}"

    single_out = str(tmp_path_factory.mktemp("row_bands_single"))
    saved_model = os.path.join(single_out, "saved_model")
    results = run_worker(1, [
        {"name": "predict", "action": "predict", "argv": model_flags(data) + [f"--restore_checkpoint_path={ckpt(save, STEPS)}"]},
        {"name": "export", "action": "mode", "argv": model_flags(data) + [
            f"--restore_checkpoint_path={ckpt(save, STEPS)}", "--mode=export", f"--saved_model_path={saved_model}"]},
    ], single_out)
    assert "error" not in results["export"] and os.path.isdir(saved_model)
    expected = np.load(os.path.join(out, "predict_predictions.npy"))
    actual = np.load(os.path.join(single_out, "predict_predictions.npy"))
    print(f"one process from the 2-band checkpoint vs its 2-rank restore: max |difference| "
          f"{np.max(np.abs(actual - expected)):.3g} over {expected.size} predictions")
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-6)
