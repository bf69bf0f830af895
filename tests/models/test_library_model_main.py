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
- the script, in one process (with tf_dlrm's kernels: the export traces TensorFlow's ops), restores the
  ``main.py`` checkpoint and exports it; a process that never imports tf_dlrm serves it and gives the script's
  probabilities (1e-6);
- ``main.py --mode=export`` exports the same checkpoint: one input per feature (``history`` as values and
  row lengths, the dynamic table's raw ``query`` keys), served by a process without tf_dlrm; its probabilities
  of the first test batch are the restored ``main.py`` model's (1e-6) and those of the whole test split give
  ``--mode=eval``'s AUC and logloss (1e-6: the same float32 graph on the same weights).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from conftest import REPO, launch, run_python

pytestmark = pytest.mark.multirank

MODEL = "tests.embedding.interest_model:InterestModel"
WORKER = "tests/embedding/custom_model_worker.py"
SERVE = os.path.join(REPO, "tests", "cli", "serve_saved_model.py")
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


@pytest.fixture(scope="module")
def trained(dataset, tmp_path_factory) -> tuple:
    """``(directory, one process's final record, two ranks' final record)``: the 40 steps on one process and
    on two ranks, the two ranks saving ``directory/main_ckpt``."""
    directory = tmp_path_factory.mktemp("library_main")
    one, two = directory / "one.jsonl", directory / "two.jsonl"
    run_python(["main.py", *flags(dataset), f"--log_path={one}"])
    launch(2, ["main.py", *flags(dataset), f"--log_path={two}", f"--save_checkpoint_path={directory}/main_ckpt"])
    return directory, final(one), final(two)


def test_library_model_trains_through_main_and_its_checkpoints_move_both_ways(dataset, trained, tmp_path):
    from tests.embedding.interest_model import serve_without_tf_dlrm

    checkpoints, first, second = trained
    assert first["steps"] == second["steps"] == STEPS and second["world_size"] == 2
    assert first["auc"] > 0.55, first  # it learned
    assert abs(first["auc"] - second["auc"]) <= 1e-4, (first, second)

    # main.py -> a user's script on 3 ranks -> the script's own checkpoint -> main.py on one process.
    launch(3, [WORKER, "--placements=auto", f"--output={tmp_path / 'restored.npz'}", f"--restore={checkpoints}/main_ckpt",
               f"--save={tmp_path}/script_ckpt"], timeout=600)
    evaluated = tmp_path / "eval.jsonl"
    run_python(["main.py", *flags(dataset), "--mode=eval", f"--restore_checkpoint_path={tmp_path}/script_ckpt",
                f"--log_path={evaluated}"])
    restored = final(evaluated)
    assert restored["world_size"] == 1 and restored["steps"] == STEPS
    assert abs(restored["auc"] - second["auc"]) <= 1e-6, (restored, second)

    # The script exports main.py's checkpoint; plain TensorFlow serves it.
    exported = tmp_path / "serving"
    run_python([WORKER, "--placements=auto", f"--output={tmp_path / 'export.npz'}", f"--restore={checkpoints}/main_ckpt",
                f"--export={exported}", f"--probe={tmp_path / 'probe.npz'}"], timeout=600)
    expected = dict(np.load(tmp_path / "export.npz"))["probe_scores"]
    served = serve_without_tf_dlrm(str(exported), str(tmp_path / "probe.npz"), str(tmp_path / "served.npy"))
    assert served.shape == expected.shape == (40,)
    np.testing.assert_allclose(served, expected, rtol=0, atol=1e-6)


def test_main_export_of_a_library_model_serves_what_eval_scores(dataset, trained, tmp_path):
    """``main.py --mode=export`` of the library model, served by TensorFlow alone, scores what ``--mode=eval``'s
    model scores: one process restores the checkpoint as ``--mode=eval`` does, predicts the first test batch
    and the whole split (tests/checkpoint/checkpoint_worker.py) and exports; another evaluates."""
    import subprocess

    from tf_dlrm.metrics import ClickMetrics

    out = tmp_path / "main_export"
    out.mkdir()
    restore = flags(dataset) + [f"--restore_checkpoint_path={trained[0]}/main_ckpt"]
    saved_model = str(out / "saved_model")
    # The export follows the predict in one process: Keras numbers the second model's unnamed layers on
    # (mlp/dense_2, ...), so the checkpoint's dense weights are matched by order, each shape checked. Eval
    # restores by name: a process of its own.
    results = {}
    for name, tasks in (("export", [{"name": "predict", "action": "predict", "argv": restore, "whole_split": True},
                                    {"name": "export", "action": "mode",
                                     "argv": restore + ["--mode=export", f"--saved_model_path={saved_model}"]}]),
                        ("eval", [{"name": "eval", "action": "mode", "argv": restore + ["--mode=eval"]}])):
        (out / f"{name}.json").write_text(json.dumps(tasks))
        run_python(["tests/checkpoint/checkpoint_worker.py", str(out / f"{name}.json"), str(out)], timeout=600)
        results.update(json.loads((out / "results.json").read_text()))
    info = json.loads(open(os.path.join(saved_model, "tf_dlrm_serving.json"), encoding="utf-8").read())
    assert info["model"] == MODEL and info["step"] == STEPS
    assert list(info["inputs"]) == ["numerical", "item", "history_values", "history_row_lengths", "user", "category",
                                    "device", "query"], list(info["inputs"])
    assert info["inputs"]["query"]["cardinality"] is None and info["inputs"]["history_values"]["ragged"] is True
    # A process started outside the repository with no PYTHONPATH, which cannot import tf_dlrm (it checks).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    stem = out / "predict"
    subprocess.run([sys.executable, SERVE, saved_model, f"{stem}_batch.npz", str(out / "served.npy"),
                    f"{stem}_split.npz={out / 'split_served.npy'}"], cwd=str(tmp_path), check=True, timeout=300,
                   env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"})
    trained = np.load(f"{stem}_predictions.npy")
    served = np.load(out / "served.npy")
    assert served.shape == trained.shape == (480,) and trained.std() > 1e-3
    np.testing.assert_allclose(served, trained, rtol=0, atol=1e-6)
    labels = np.load(f"{stem}_split_labels.npy")
    split = ClickMetrics.of(labels, np.load(out / "split_served.npy")[: len(labels)])
    evaluated = results["eval"]
    assert evaluated["samples"] == len(labels) == 480
    assert abs(split.auc - evaluated["auc"]) <= 1e-6 and abs(split.logloss - evaluated["logloss"]) <= 1e-6


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
