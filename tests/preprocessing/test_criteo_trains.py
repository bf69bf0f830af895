"""Real Criteo rows -> preprocessing.criteo -> main.py trains on the result and evaluates it."""

from __future__ import annotations

import json
import math
import os

from conftest import REPO, run_python

SAMPLE = os.path.join(os.path.dirname(REPO), "shared", "data", "criteo_kaggle_sample_200.csv")


def test_model_trains_on_preprocessed_criteo_rows(tmp_path):
    data, log = tmp_path / "criteo", tmp_path / "log.jsonl"
    run_python([
        "-m", "preprocessing.criteo", f"--input={SAMPLE}", f"--output_dir={data}", "--frequency_threshold=1",
        "--split=fraction", "--test_fraction=0.25",
    ])
    run_python([
        "main.py", f"--dataset_path={data}", "--embedding_dim=8", "--bottom_mlp_dims=16,8", "--top_mlp_dims=16,1",
        "--batch_size=50", "--epochs=2", "--learning_rate=0.1", "--optimizer=sgd", "--embedding_optimizer=sgd", "--print_freq=1", f"--log_path={log}",
    ])
    final = json.loads(open(log, encoding="utf-8").read().splitlines()[-1])
    assert final["event"] == "final" and final["steps"] == 2 * (150 // 50)
    assert 0.0 <= final["auc"] <= 1.0 and math.isfinite(final["logloss"])
