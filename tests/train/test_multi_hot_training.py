"""main.py on a multi-hot, mixed-width synthetic dataset: 2 ranks learn it, the checkpoint restores
onto 1 rank (resharded) with the same validation AUC, and width errors name the tables or flag."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from conftest import launch, run_python

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLAGS = ["--interaction=cat", "--bottom_mlp_dims=64,16", "--top_mlp_dims=64,32,1", "--batch_size=1024",
         "--embedding_dims=cat_0.bin:4"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from tf_dlrm.data.synthetic import generate
    from tf_dlrm.spec.feature_spec import FeatureSpec

    directory = tmp_path_factory.mktemp("multi_hot")
    spec = FeatureSpec.load(os.path.join(REPO, "feature_specs", "synthetic_multi_hot.yaml"), check_files=False)
    generate(spec, str(directory), num_train_samples=100_000, num_valid_samples=20_000, seed=1)
    return directory


def final(path) -> dict:
    return json.loads(open(path, encoding="utf-8").read().splitlines()[-1])


@pytest.mark.multirank
def test_two_ranks_learn_and_one_rank_restores_the_same_model(dataset, tmp_path):
    log, checkpoints = tmp_path / "train.jsonl", tmp_path / "checkpoints"
    launch(2, ["main.py", f"--dataset_path={dataset}", *FLAGS, "--learning_rate=1.0", "--optimizer=sgd", "--embedding_optimizer=sgd", "--epochs=2", "--seed=7",
               f"--save_checkpoint_path={checkpoints}", f"--log_path={log}"], timeout=600)
    trained = final(log)
    oracle = yaml.safe_load(open(dataset / "feature_spec.yaml"))["metadata"]["oracle_valid_auc"]
    assert trained["world_size"] == 2 and trained["auc"] >= oracle - 0.04, (trained, oracle)
    evaluated = tmp_path / "eval.jsonl"
    run_python(["main.py", f"--dataset_path={dataset}", *FLAGS, "--mode=eval", f"--restore_checkpoint_path={checkpoints}",
                f"--log_path={evaluated}"])
    restored = final(evaluated)
    assert restored["world_size"] == 1
    # The same weights on one rank: only the order of float sums in the forward pass differs.
    assert abs(restored["auc"] - trained["auc"]) <= 1e-6 and abs(restored["logloss"] - trained["logloss"]) <= 1e-5


def test_width_errors_name_the_tables_or_the_flag(dataset):
    dot = run_python(["main.py", f"--dataset_path={dataset}", "--interaction=dot", "--bottom_mlp_dims=64,16", "--embedding_dim=16",
                      "--max_steps=1"], check=False)
    assert dot.returncode != 0
    assert "one width for every embedding table" in dot.stderr and "cat_1.bin: table 'cat_1.bin' width 8" in dot.stderr
    unknown = run_python(["main.py", f"--dataset_path={dataset}", *FLAGS[:-1], "--embedding_dims=cat_99:4", "--max_steps=1"],
                         check=False)
    assert unknown.returncode != 0 and "--embedding_dims names unknown table(s) ['cat_99']" in unknown.stderr
