"""``--keep_best`` and ``--test_split``: the final result and the saved checkpoint are those of the
best evaluation, and the test split is reported once, at that state, without choosing it.

A small model overfits 4,000 synthetic rows with lazy Adam at a high rate over 4 epochs, so the
validation AUC peaks before the end; the run must report the peak (and its step), and the
checkpoint it saves must evaluate to that same AUC (1e-6: the same weights, evaluated again).

The test split is the validation split with every label inverted: its AUC at any state is one minus
the validation AUC there. Had it taken part in the choice, the step chosen would be the validation
AUC's minimum, not its maximum; it must not, and its reported AUC must be one minus the chosen
step's validation AUC.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import yaml

from conftest import make_synthetic_small, run_python
from tf_dlrm.checkpoint import store as checkpoint_store


def events(path) -> list[dict]:
    return [json.loads(line) for line in open(path, encoding="utf-8").read().splitlines()]


def add_inverted_split(data, name: str = "inverted", source: str = "validation") -> None:
    """A copy of the ``source`` split under ``name`` with 1 - label (labels are one byte: bool)."""
    shutil.copytree(data / source, data / name)
    labels = np.fromfile(data / source / "label.bin", np.uint8)
    (1 - labels).astype(np.uint8).tofile(data / name / "label.bin")
    spec_path = data / "feature_spec.yaml"
    spec = yaml.safe_load(open(spec_path))
    spec["source_spec"][name] = [
        {**entry, "files": [path.replace(f"{source}/", f"{name}/", 1) for path in entry["files"]]}
        for entry in spec["source_spec"][source]
    ]
    yaml.safe_dump(spec, open(spec_path, "w"), sort_keys=False)


def scalar_tags(directory) -> set[str]:
    import tensorflow as tf

    tags = set()
    for name in os.listdir(directory):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(directory, name)):
            tags.update(value.tag for value in event.summary.value)
    return tags


def test_keep_best_reports_restores_and_saves_the_best_evaluation(tmp_path):
    data = make_synthetic_small(tmp_path / "data", seed=3, num_train=4000, num_valid=4000)
    add_inverted_split(data)
    flags = [
        f"--dataset_path={data}", "--embedding_dim=8", "--bottom_mlp_dims=16,8", "--top_mlp_dims=32,1", "--batch_size=256",
        "--epochs=4", "--evals_per_epoch=2", "--embedding_optimizer=lazy_adam", "--embedding_learning_rate=0.05",
        "--optimizer=adam", "--dense_learning_rate=0.01", "--seed=5", "--test_split=inverted",
        # The trajectory this test's checks were found on (the best AUC and the lowest logloss on different
        # evaluations): without the rare-id regularizer, with which this run overfits less and they coincide.
        "--embedding_frequency_l2=0", "--embedding_min_count=1",
    ]
    save, board = tmp_path / "checkpoints", tmp_path / "board"
    trained = run_python(["main.py", *flags, "--keep_best", f"--save_checkpoint_path={save}", "--checkpoint_every_steps=7",
                          "--keep_checkpoints=2", f"--log_path={tmp_path / 'train.jsonl'}", f"--tensorboard_dir={board}"])
    log = events(tmp_path / "train.jsonl")
    evals = [e for e in log if e["event"] == "eval"]
    best = max(evals, key=lambda e: e["auc"])
    assert best["step"] < evals[-1]["step"] and best["auc"] > evals[-1]["auc"] + 1e-4, "the AUC did not peak early"
    assert min(evals, key=lambda e: e["auc"])["step"] != best["step"]
    final = log[-1]
    assert final["best_step"] == best["step"] and final["auc"] == best["auc"] and final["steps"] == evals[-1]["step"]
    # The figures of the chosen state before the calibration fitted on it at the end (same ranking: same AUC).
    assert final["uncalibrated_ne"] == best["ne"] and final["uncalibrated_calibration"] == best["calibration"]
    assert final["calibrated"]["step"] == best["step"] and final["ne"] < best["ne"]
    # The test split: evaluated once, at the chosen step, with the inverted labels' figures.
    tested = [e for e in log if e["event"] == "final_test"]
    assert len(tested) == 1 and tested[0]["step"] == best["step"] and tested[0]["split"] == "inverted"
    assert abs(tested[0]["auc"] - (1 - best["auc"])) <= 1e-12, (tested, best)
    assert abs(tested[0]["positive_rate"] - (1 - best["positive_rate"])) <= 1e-12
    assert tested[0]["samples"] == best["samples"] == 4000
    assert final["test_auc"] == tested[0]["auc"] and final["test_ne"] == tested[0]["ne"]
    assert (final["split"], final["selected_on"], final["test_split"]) == ("validation", "validation", "inverted")
    assert f"test (inverted) at step {best['step']}: AUC {tested[0]['auc']:.6f}" in trained.stderr
    assert {"auc", "logloss", "ne", "calibration", "positive_rate", "test_auc", "test_ne"} <= scalar_tags(board)
    # Saved every 7 steps (with each evaluation), 2 kept: the best one was kept past its turn, and at the
    # end it is the newest (what the directory resolves to); the later ones, of rejected states, are gone.
    saved = [e["step"] for e in log if e["event"] == "checkpoint_saved"]
    assert best["step"] in saved and max(saved) > best["step"] + 14, saved
    assert [step for step, _ in checkpoint_store.list_checkpoints(str(save))] == [best["step"]]
    run_python(["main.py", *flags, "--mode=eval", f"--restore_checkpoint_path={save}", f"--log_path={tmp_path / 'eval.jsonl'}"])
    evaluated = events(tmp_path / "eval.jsonl")[-1]
    assert abs(evaluated["auc"] - best["auc"]) <= 1e-6, (evaluated, best)
    assert abs(evaluated["test_auc"] - tested[0]["auc"]) <= 1e-6, (evaluated, tested)
    for name in ("uncalibrated_ne", "uncalibrated_calibration", "positive_rate"):
        assert abs(evaluated[name] - best[name.removeprefix("uncalibrated_")]) <= 1e-5, (name, evaluated, best)
    assert abs(evaluated["ne"] - final["ne"]) <= 1e-5  # the checkpoint's calibration applied
    # --early_stopping_metric=logloss: the state of the lowest validation logloss, which here comes
    # before the best AUC (the model turns over-confident first), is the one kept.
    by_loss = run_python(["main.py", *flags, "--keep_best", "--early_stopping_metric=logloss",
                          f"--log_path={tmp_path / 'logloss.jsonl'}"])
    loss_log = events(tmp_path / "logloss.jsonl")
    loss_evals = [e for e in loss_log if e["event"] == "eval"]
    lowest = min(loss_evals, key=lambda e: e["logloss"])
    assert [e["auc"] for e in loss_evals] == [e["auc"] for e in evals]  # the same training
    assert lowest["step"] != best["step"], "the lowest logloss and the best AUC fell on the same evaluation"
    assert loss_log[-1]["best_step"] == lowest["step"] and loss_log[-1]["uncalibrated_logloss"] == lowest["logloss"]
    assert f"restored the state of step {lowest['step']} (validation logloss {lowest['logloss']:.6f})" in by_loss.stderr
    # A test split the spec lacks: refused before training, naming the flag and the spec's splits.
    typo = run_python(["main.py", *flags[:-1], "--test_split=tset"], check=False)
    assert typo.returncode == 2 and "--test_split=tset is not a split of" in typo.stderr, typo.stderr[-2000:]
    assert "'inverted'" in typo.stderr
