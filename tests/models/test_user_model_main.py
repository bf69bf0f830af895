"""A model defined outside tf_dlrm (tests/models/two_tower.py) trains, checkpoints, restores on another
world size and exports through ``main.py --model=<import path>``, with no change to tf_dlrm.

On the checkpoint tests' tiny synthetic dataset (1536 training rows, 1500 validation rows):

- one process and ``horovodrun -np 2`` (column-wise tables) train the same 8 steps: the same model,
  so the same validation AUC (1e-3: float32 sums in another order over a few steps);
- ``--mode=eval`` in one process restores the 2-rank checkpoint (resharded) and gets the 2-rank
  run's AUC (1e-6: the same weights, exact AUC); the checkpoint records the import path and the
  model's own config, and a restore with another ``--tower_dims`` is refused naming that flag;
- ``--mode=export`` writes a SavedModel that a fresh interpreter serves without tf_dlrm; its
  probabilities on the whole validation split give the eval AUC again (1e-6).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from conftest import launch, run_python

pytestmark = pytest.mark.multirank

MODEL = "tests.models.two_tower:TwoTower"
STEPS = 8


def flags(data: str) -> list[str]:
    return [f"--dataset_path={data}", f"--model={MODEL}", "--tower_dims=16,8", "--embedding_dim=8", "--batch_size=192",
            "--valid_batch_size=1500", "--learning_rate=0.05", "--optimizer=adam", "--embedding_optimizer=lazy_adam",
            "--evals_per_epoch=0", f"--max_steps={STEPS}", "--print_freq=4", "--seed=3"]


def final(log) -> dict:
    lines = [json.loads(line) for line in open(log, encoding="utf-8").read().splitlines()]
    assert lines[-1]["event"] == "final"
    return lines[-1]


def events(log, name) -> list[dict]:
    return [e for e in map(json.loads, open(log, encoding="utf-8").read().splitlines()) if e["event"] == name]


def test_user_model_through_main(tmp_path_factory):
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "checkpoint"))
    from checkpoint_runs import dataset

    data = dataset(tmp_path_factory)
    out = tmp_path_factory.mktemp("user_model")
    one, two = out / "one.jsonl", out / "two.jsonl"
    run_python(["main.py", *flags(data), f"--log_path={one}", f"--save_checkpoint_path={out}/ckpt_one"])
    launch(2, ["main.py", *flags(data), "--dist_strategy=column_wise", f"--log_path={two}",
               f"--save_checkpoint_path={out}/ckpt_two"])
    first, second = final(one), final(two)
    assert first["steps"] == second["steps"] == STEPS and second["world_size"] == 2
    assert abs(first["auc"] - second["auc"]) <= 1e-3, (first, second)
    # Reporting is the model's own describe(): the CLI names no model attribute.
    assert events(two, "towers") == [{"event": "towers", "tower_dims": [16, 8]}]

    checkpoint = f"{out}/ckpt_two"
    (latest,) = [name for name in os.listdir(checkpoint) if name.startswith("ckpt-")]
    with open(os.path.join(checkpoint, latest, "manifest.json")) as handle:
        model = json.load(handle)["model"]
    assert (model["name"], model["config"]) == (MODEL, {"tower_dims": [16, 8]})

    evaluated = out / "eval.jsonl"
    run_python(["main.py", *flags(data), "--mode=eval", f"--restore_checkpoint_path={checkpoint}", f"--log_path={evaluated}"])
    restored = final(evaluated)
    assert restored["world_size"] == 1 and restored["steps"] == STEPS
    assert abs(restored["auc"] - second["auc"]) <= 1e-6, (restored, second)

    other = [f for f in flags(data) if not f.startswith("--tower_dims")] + ["--tower_dims=32,8"]
    refused = run_python(["main.py", *other, "--mode=eval", f"--restore_checkpoint_path={checkpoint}"], check=False)
    assert refused.returncode != 0
    assert "--tower_dims: [16, 8] in the checkpoint, [32, 8] from the flags" in refused.stderr, refused.stderr[-2000:]

    saved = str(out / "saved")
    run_python(["main.py", *flags(data), "--mode=export", f"--restore_checkpoint_path={checkpoint}", f"--saved_model_path={saved}"])
    with open(os.path.join(saved, "tf_dlrm_serving.json")) as handle:
        assert json.load(handle)["model"] == MODEL
    batch, labels = validation_split(data, str(out / "valid.npz"))
    served = str(out / "served.npy")
    run_python(["tests/cli/serve_saved_model.py", saved, batch, served])
    from tf_dlrm.metrics import exact_auc

    assert abs(exact_auc(labels, np.load(served)) - restored["auc"]) <= 1e-6


def validation_split(data: str, path: str) -> tuple[str, np.ndarray]:
    """Every validation row as the serving signature takes them (``path``: ``numerical`` and one input of ids
    per categorical feature, under its serving name), and their labels."""
    from tf_dlrm.data.reader import SplitBinaryReader
    from tf_dlrm.embedding.serving import input_name
    from tf_dlrm.spec.feature_spec import FeatureSpec

    spec = FeatureSpec.load(os.path.join(data, "feature_spec.yaml"))
    # input_modes=None: every categorical feature's local ids, in spec order (one rank: the whole batch).
    reader = SplitBinaryReader(spec, "validation", 1500, rank=0, world_size=1, input_modes=None, last_batch="drop",
                               shuffle=False)
    numerical, categorical, label = reader.read_batch(0)
    ids = {input_name(feature): np.asarray(column).reshape(-1).astype(np.int64)
           for feature, column in zip(spec.categorical_features, categorical)}
    np.savez(path, numerical=np.asarray(numerical, np.float32), **ids)
    return path, np.asarray(label).reshape(-1)
