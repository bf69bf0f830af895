"""Criteo rows -> preprocessing.criteo -> main.py learns them.

On the 200 real Kaggle rows ($TF_DLRM_CRITEO_SAMPLES) where present, else on 200 generated rows in the
same layout (one launch either way: see ``criteo_real_or_generated``). 200 rows are too few for a
held-out AUC that says anything, so the model is evaluated on the 150 rows it trained on: a trainer
that reads the preprocessed ids and updates the weights fits them (measured 0.985 after 20 epochs),
one that does not stays near 0.5."""

from __future__ import annotations

import json
import math

from conftest import run_python


def test_model_learns_preprocessed_criteo_rows(tmp_path, criteo_real_or_generated):
    data, log = tmp_path / "criteo", tmp_path / "log.jsonl"
    run_python([
        "-m", "preprocessing.criteo", f"--input={criteo_real_or_generated.csv}", f"--output_dir={data}", "--frequency_threshold=1",
        "--split=fraction", "--test_fraction=0.25", "--valid_fraction=0",  # 150 rows to train on and evaluate
    ])
    run_python([
        "main.py", f"--dataset_path={data}", "--embedding_dim=8", "--bottom_mlp_dims=16,8", "--top_mlp_dims=16,1",
        "--batch_size=50", "--epochs=20", "--learning_rate=0.5", "--optimizer=sgd", "--embedding_optimizer=sgd",
        "--print_freq=100", "--valid_split=train", f"--log_path={log}",
    ])
    final = json.loads(open(log, encoding="utf-8").read().splitlines()[-1])
    assert final["event"] == "final" and final["steps"] == 20 * (150 // 50)
    assert final["auc"] >= 0.9 and math.isfinite(final["logloss"]), final
