"""``--calibration`` (on by default) end to end: ``main.py`` fits the map on the validation split at the end of
training and keeps it in the final checkpoint; the test figures improve by it; ``--mode=eval`` of that checkpoint,
on 1 rank or on 2 that saved it, prints the same figures; the exported SavedModel serves eval's probabilities."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from conftest import launch, run_python
from test_evaluation_splits import events, make_three_splits

# The overfitting model of test_evaluation_splits.py: its probabilities are overconfident after 4 epochs.
FLAGS = ["--embedding_dim=8", "--bottom_mlp_dims=16,8", "--top_mlp_dims=32,1", "--batch_size=256", "--epochs=4",
         "--evals_per_epoch=2", "--embedding_optimizer=lazy_adam", "--embedding_learning_rate=0.05",
         "--optimizer=adam", "--dense_learning_rate=0.01", "--seed=5",
         # An overfit, overconfident run is what the map must correct: the rare-id regularizer off (with it this run
         # overfits less, and its map's scale is 0.54 where the checks below ask for under 0.5).
         "--embedding_frequency_l2=0", "--embedding_min_count=1"]
_runs: dict = {}


def runs(tmp_path_factory) -> dict:
    """One dataset (train/validation/test, 4000 rows each) and the runs the tests read, made once."""
    if not _runs:
        root = tmp_path_factory.mktemp("calibration")
        data = make_three_splits(root / "three")
        common = [f"--dataset_path={data}", *FLAGS]
        trained = run_python(["main.py", *common, f"--save_checkpoint_path={root / 'ckpt'}",
                              f"--log_path={root / 'train.jsonl'}"])
        run_python(["main.py", *common, "--calibration=none", f"--log_path={root / 'none.jsonl'}"])
        evaluated = run_python(["main.py", *common, "--mode=eval", f"--restore_checkpoint_path={root / 'ckpt'}",
                                f"--log_path={root / 'eval.jsonl'}"])
        _runs.update(root=root, data=data, common=common, trained=trained.stdout + trained.stderr,
                     evaluated=evaluated.stdout + evaluated.stderr)
    return _runs


def final(path) -> dict:
    return events(path)[-1]


def test_training_fits_the_calibration_on_validation_and_the_test_figures_improve(tmp_path_factory):
    run = runs(tmp_path_factory)
    log = events(run["root"] / "train.jsonl")
    record, last_eval = log[-1], [e for e in log if e["event"] == "eval"][-1]
    (fitted,) = [e for e in log if e["event"] == "calibration"]
    assert record["calibrated"]["method"] == "platt" and record["calibrated"]["split"] == "validation"
    assert record["calibrated"]["step"] == record["steps"] == fitted["step"] and fitted["map"]["scale"] > 0
    # Overconfident at the end (the last evaluation's logloss is far above the best one's); the map pulls the
    # logits back to 0 (scale < 1) and the validation figures match the observed rate.
    assert record["calibrated"]["scale"] < 0.5 and abs(record["calibration"] - 1) < 1e-3
    assert record["uncalibrated_logloss"] == last_eval["logloss"] and record["auc"] == last_eval["auc"]
    assert record["logloss"] < record["uncalibrated_logloss"] - 0.1
    # On the test split, which fitted nothing: NE with the map at or below NE without it (here well below).
    assert record["test_ne"] <= record["test_uncalibrated_ne"] - 0.1
    assert abs(record["test_calibration"] - 1) < abs(record["test_uncalibrated_calibration"] - 1)
    # --calibration=none: the same model, its own figures, nothing fitted.
    plain = final(run["root"] / "none.jsonl")
    assert plain["calibrated"] is None and "uncalibrated_logloss" not in plain and "test_uncalibrated_ne" not in plain
    assert plain["test_ne"] == record["test_uncalibrated_ne"] and plain["test_auc"] == record["test_auc"]
    assert record["test_ne"] <= plain["test_ne"]
    for line in ("calibration fitted on validation (4000 samples) at step 60: platt: logit * ", "test NE (uncalibrated)",
                 "validation calibration (uncalibrated)", "calibration map"):
        assert line in run["trained"], line
    # The final checkpoint keeps the map.
    manifest = json.loads(open(os.path.join(run["root"], "ckpt", "ckpt-00000060", "manifest.json")).read())
    assert manifest["calibration"] == record["calibrated"]


def test_eval_of_the_checkpoint_prints_the_training_figures(tmp_path_factory):
    run = runs(tmp_path_factory)
    trained, evaluated = final(run["root"] / "train.jsonl"), final(run["root"] / "eval.jsonl")
    names = ["auc", "logloss", "ne", "calibration", "uncalibrated_logloss", "uncalibrated_ne", "uncalibrated_calibration"]
    names += [f"test_{name}" for name in names]
    assert {name: evaluated[name] for name in names} == {name: trained[name] for name in names}
    assert evaluated["calibrated"] == trained["calibrated"]
    summary = run["evaluated"][run["evaluated"].rindex("checkpoint "):]
    for name, value in (("validation NE", trained["ne"]), ("validation NE (uncalibrated)", trained["uncalibrated_ne"]),
                        ("test calibration", trained["test_calibration"])):
        assert f"{name} " in summary and f"{value:.6f}" in summary, (name, summary)


def test_the_export_serves_the_probabilities_eval_scores(tmp_path_factory, tmp_path):
    run = runs(tmp_path_factory)
    saved, batch, scored, served = tmp_path / "saved", tmp_path / "batch.npz", tmp_path / "eval.npz", tmp_path / "served.npy"
    checkpoint = f"--restore_checkpoint_path={run['root'] / 'ckpt'}"
    exported = run_python(["main.py", *run["common"], "--mode=export", checkpoint, f"--saved_model_path={saved}"])
    assert "calibration map  platt: logit * " in exported.stdout + exported.stderr
    info = json.loads((saved / "tf_dlrm_serving.json").read_text())
    assert info["calibration"] == final(run["root"] / "train.jsonl")["calibrated"]
    # Every validation row in one batch, scored as --mode=eval scores it, then served by TensorFlow alone.
    run_python(["tests/cli/calibrated_rows.py", str(batch), str(scored), *run["common"], checkpoint,
                "--valid_batch_size=4000"])
    run_python(["tests/cli/serve_saved_model.py", str(saved), str(batch), str(served)])
    expected, probabilities = np.load(scored), np.load(served)
    assert probabilities.shape == expected["probability"].shape == (4000,)
    # float32 serving against float64 evaluation of the same float32 logits: a few float32 ulps of a probability.
    np.testing.assert_allclose(probabilities, expected["probability"], rtol=0, atol=1e-6)
    # They are eval's rows: scored as evaluation scores them, they give its figures.
    from tf_dlrm.metrics import ClickMetrics

    figures = ClickMetrics.of(expected["label"], expected["probability"])
    evaluated = final(run["root"] / "eval.jsonl")
    assert figures.logloss == pytest.approx(evaluated["logloss"], abs=1e-12)
    assert figures.calibration == pytest.approx(evaluated["calibration"], abs=1e-12)
    assert ClickMetrics.of(expected["label"], probabilities).logloss == pytest.approx(evaluated["logloss"], abs=1e-6)


def test_a_checkpoint_saved_on_two_ranks_evaluates_the_same_on_one(tmp_path_factory, tmp_path):
    """Two ranks train with --keep_best and periodic checkpoints: the chosen step's checkpoint was saved before the
    map was fitted, and gets it in its manifest; --mode=eval on one rank applies it."""
    run = runs(tmp_path_factory)
    launch(2, ["main.py", *run["common"], "--keep_best", "--checkpoint_every_steps=7",
               f"--save_checkpoint_path={tmp_path / 'ckpt'}", f"--log_path={tmp_path / 'train.jsonl'}"])
    trained = final(tmp_path / "train.jsonl")
    assert trained["world_size"] == 2 and trained["best_step"] < trained["steps"]
    assert trained["best_step"] % 7 == 0  # its checkpoint was saved during training
    chosen = tmp_path / "ckpt" / f"ckpt-{trained['best_step']:08d}"
    assert json.loads((chosen / "manifest.json").read_text())["calibration"] == trained["calibrated"]
    run_python(["main.py", *run["common"], "--mode=eval", f"--restore_checkpoint_path={tmp_path / 'ckpt'}",
                f"--log_path={tmp_path / 'eval.jsonl'}"])
    evaluated = final(tmp_path / "eval.jsonl")
    assert evaluated["world_size"] == 1 and evaluated["steps"] == trained["best_step"]
    assert evaluated["calibrated"] == trained["calibrated"]
    # Another batch split of the same rows: the MLPs' sums in another order (float32 roundoff, about 1e-7 of a
    # logit), far inside 1e-5 of a mean logloss over 4000 rows.
    for name in ("auc", "logloss", "ne", "calibration", "uncalibrated_logloss", "test_logloss", "test_calibration"):
        assert evaluated[name] == pytest.approx(trained[name], abs=1e-5), name
