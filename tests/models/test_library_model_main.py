"""A model written against ``tf_dlrm.embedding`` only (tests/embedding/interest_model.py: a row-wise Adagrad table
shared by a one-hot and a ragged feature, lazy Adam, Adagrad, a replicated and a dynamic table, every placement
``"auto"``) trains through ``main.py --model=<import path>`` on a FeatureSpec dataset, with no change to tf_dlrm,
and its checkpoints move between ``main.py`` and a user's script in both directions:

- one process and ``horovodrun -np 2`` train the same 40 steps: the same model, so the same test AUC (1e-4:
  float32 sums in another order, 40 steps of Adam and Adagrad on a 480-row split);
- the 2-rank ``main.py`` checkpoint restores with ``model_checkpoint.restore`` in a plain script on 3 ranks
  (tests/embedding/custom_model_worker.py), which saves it again with ``model_checkpoint.save``; ``main.py
  --mode=eval`` restores that script's checkpoint in one process and gets the 2-rank run's AUC (1e-6: the
  same weights, moved bit for bit);
- the script, in one process without tf_dlrm's kernels, restores the ``main.py`` checkpoint and exports it; a
  process that never imports tf_dlrm serves it and gives the script's scores (1e-6).
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from conftest import REPO, launch, run_python

pytestmark = pytest.mark.multirank

MODEL = "tests.embedding.interest_model:InterestModel"
WORKER = "tests/embedding/custom_model_worker.py"
BATCH, STEPS = 48, 40


def flags(data: str, model: str = MODEL) -> list[str]:
    return [f"--dataset_path={data}", f"--model={model}", f"--batch_size={BATCH}", "--valid_batch_size=480",
            "--learning_rate=0.01", "--optimizer=adam", "--epochs=1", "--print_freq=20", "--seed=5"]


def final(log) -> dict:
    lines = [json.loads(line) for line in open(log, encoding="utf-8").read().splitlines()]
    assert lines[-1]["event"] == "final"
    return lines[-1]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    sys.path.insert(0, REPO)
    from tests.embedding.interest_model import write_dataset

    return write_dataset(str(tmp_path_factory.mktemp("interest_data")), {"train": (BATCH * STEPS, 5), "test": (480, 6)})


def test_library_model_trains_through_main_and_its_checkpoints_move_both_ways(dataset, tmp_path):
    from tests.embedding.interest_model import serve_without_tf_dlrm

    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    run_python(["main.py", *flags(dataset), f"--log_path={one}"])
    launch(2, ["main.py", *flags(dataset), f"--log_path={two}", f"--save_checkpoint_path={tmp_path}/main_ckpt"])
    first, second = final(one), final(two)
    assert first["steps"] == second["steps"] == STEPS and second["world_size"] == 2
    assert first["auc"] > 0.55, first  # it learned
    assert abs(first["auc"] - second["auc"]) <= 1e-4, (first, second)

    # main.py -> a user's script on 3 ranks -> the script's own checkpoint -> main.py on one process.
    launch(3, [WORKER, "--placements=auto", f"--output={tmp_path / 'restored.npz'}", f"--restore={tmp_path}/main_ckpt",
               f"--save={tmp_path}/script_ckpt"], timeout=600)
    evaluated = tmp_path / "eval.jsonl"
    run_python(["main.py", *flags(dataset), "--mode=eval", f"--restore_checkpoint_path={tmp_path}/script_ckpt",
                f"--log_path={evaluated}"])
    restored = final(evaluated)
    assert restored["world_size"] == 1 and restored["steps"] == STEPS
    assert abs(restored["auc"] - second["auc"]) <= 1e-6, (restored, second)

    # The script exports main.py's checkpoint; plain TensorFlow serves it.
    exported = tmp_path / "serving"
    run_python([WORKER, "--placements=auto", f"--output={tmp_path / 'export.npz'}", f"--restore={tmp_path}/main_ckpt",
                f"--export={exported}", f"--probe={tmp_path / 'probe.npz'}"], timeout=600,
               env={"TF_DLRM_DISABLE_KERNELS": "1"})
    expected = dict(np.load(tmp_path / "export.npz"))["probe_scores"]
    served = serve_without_tf_dlrm(str(exported), str(tmp_path / "probe.npz"), str(tmp_path / "served.npy"))
    assert served.shape == expected.shape == (40, 1)
    np.testing.assert_allclose(served, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("model, extra, message", [
    (MODEL, ["--deduplicate_exchange"], f"--deduplicate_exchange lay out the tables main.py makes from the spec; "
                                        f"--model={MODEL} makes its own"),
    (MODEL, ["--xla"], "--xla compiles the part of a model after its embedding lookup, which InterestModel does not name"),
    ("tests.embedding.interest_model:make_features", [],
     "--model=tests.embedding.interest_model:make_features: expected a tf_dlrm.embedding.Model. Received: list"),
])
def test_what_main_cannot_do_with_a_library_model_is_refused_in_one_line(dataset, model, extra, message):
    refused = run_python(["main.py", *flags(dataset, model), "--max_steps=2", *extra], check=False)
    assert refused.returncode != 0
    assert message in refused.stderr, refused.stderr[-2000:]
