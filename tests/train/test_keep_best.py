"""``--keep_best``: the final result and the saved checkpoint are those of the best evaluation.

A small model overfits 4,000 synthetic rows with lazy Adam at a high rate over 4 epochs, so the
validation AUC peaks before the end; the run must report the peak (and its step), and the
checkpoint it saves must evaluate to that same AUC (1e-6: the same weights, evaluated again).
"""

from __future__ import annotations

import json

from conftest import make_synthetic_small, run_python


def events(path) -> list[dict]:
    return [json.loads(line) for line in open(path, encoding="utf-8").read().splitlines()]


def test_keep_best_reports_restores_and_saves_the_best_evaluation(tmp_path):
    data = make_synthetic_small(tmp_path / "data", seed=3, num_train=4000, num_valid=4000)
    flags = [
        f"--dataset_path={data}", "--embedding_dim=8", "--bottom_mlp_dims=16,8", "--top_mlp_dims=32,1", "--batch_size=256",
        "--epochs=4", "--evals_per_epoch=2", "--embedding_optimizer=lazy_adam", "--embedding_learning_rate=0.05",
        "--optimizer=adam", "--dense_learning_rate=0.01", "--seed=5",
    ]
    save = tmp_path / "checkpoints"
    run_python(["main.py", *flags, "--keep_best", f"--save_checkpoint_path={save}", f"--log_path={tmp_path / 'train.jsonl'}"])
    log = events(tmp_path / "train.jsonl")
    evals = [e for e in log if e["event"] == "eval"]
    best = max(evals, key=lambda e: e["auc"])
    assert best["step"] < evals[-1]["step"] and best["auc"] > evals[-1]["auc"] + 1e-4, "the AUC did not peak early"
    final = log[-1]
    assert final["best_step"] == best["step"] and final["auc"] == best["auc"] and final["steps"] == evals[-1]["step"]
    run_python(["main.py", *flags, "--mode=eval", f"--restore_checkpoint_path={save}", f"--log_path={tmp_path / 'eval.jsonl'}"])
    evaluated = events(tmp_path / "eval.jsonl")[-1]
    assert abs(evaluated["auc"] - best["auc"]) <= 1e-6, (evaluated, best)
