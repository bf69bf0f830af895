"""Which split chooses and which one is reported (``tf_dlrm.cli.evaluation_splits``), and ``main.py`` on the two
kinds of dataset: train/validation/test (choose on validation, report test) and NVIDIA's train/test (evaluate test,
choose on nothing unless ``--select_on_test``)."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from conftest import run_python
from tf_dlrm.cli.evaluation_splits import EvaluationSplits, check_selection, resolve

THREE = ["train", "validation", "test"]


@pytest.mark.parametrize("valid_flag, test_flag, splits, expected", [
    ("auto", "auto", THREE, EvaluationSplits("validation", "test", True)),
    ("auto", "auto", ["train", "valid", "test"], EvaluationSplits("valid", "test", True)),
    ("auto", "auto", ["train", "val", "validation"], EvaluationSplits("validation", "", True)),
    # NVIDIA's layout: test is evaluated during training, and nothing chooses by it.
    ("auto", "auto", ["train", "test"], EvaluationSplits("test", "", False)),
    ("auto", "auto", ["train"], EvaluationSplits("", "", False)),
    # Named by hand: taken as named, test included (still not a split to choose by).
    ("test", "auto", THREE, EvaluationSplits("test", "", False)),
    ("validation", "", THREE, EvaluationSplits("validation", "", True)),
    ("", "auto", THREE, EvaluationSplits("", "test", False)),
    ("none", "none", THREE, EvaluationSplits("", "", False)),
    ("auto", "inverted", ["train", "validation", "inverted"], EvaluationSplits("validation", "inverted", True)),
    ("tset", "auto", ["train", "test"], EvaluationSplits("tset", "test", True)),
])
def test_resolve(valid_flag, test_flag, splits, expected):
    assert resolve(valid_flag, test_flag, splits) == expected


def test_select_on_test_lets_the_test_split_choose():
    assert resolve("auto", "auto", ["train", "test"], select_on_test=True) == EvaluationSplits("test", "", True)
    assert resolve("auto", "auto", THREE, select_on_test=True) == EvaluationSplits("validation", "test", True)


@pytest.mark.parametrize("keep_best, patience, threshold, flag", [
    (True, 0, None, "--keep_best"), (True, 3, None, "--early_stopping_patience"), (False, 0, 0.8, "--auc_threshold"),
])
def test_choosing_by_the_test_split_is_refused_naming_the_flag(keep_best, patience, threshold, flag):
    resolved = resolve("auto", "auto", ["train", "test"])
    with pytest.raises(ValueError) as raised:
        check_selection(resolved, ["train", "test"], keep_best, patience, threshold)
    message = str(raised.value)
    assert message.startswith(f"{flag} would choose by the 'test' split") and "--select_on_test" in message
    assert "\n" not in message
    # Allowed where a validation split chooses, with --select_on_test, or where nothing is evaluated.
    check_selection(resolve("auto", "auto", THREE), THREE, keep_best, patience, threshold)
    check_selection(resolve("auto", "auto", ["train", "test"], True), ["train", "test"], keep_best, patience, threshold)
    check_selection(resolve("", "auto", ["train", "test"]), ["train", "test"], keep_best, 0, threshold)
    check_selection(resolved, ["train", "test"], False, 0, None)


def events(path) -> list[dict]:
    return [json.loads(line) for line in open(path, encoding="utf-8").read().splitlines()]


def make_three_splits(directory):
    from conftest import REPO
    from tf_dlrm.data.synthetic import generate
    from tf_dlrm.spec.feature_spec import FeatureSpec

    spec = FeatureSpec.load(f"{REPO}/feature_specs/synthetic_small.yaml", check_files=False)
    generate(spec, str(directory), num_train_samples=4000, num_valid_samples=4000, seed=3, num_test_samples=4000)
    return directory


def without_validation(three, directory):
    """The same dataset as NVIDIA's layout: train and test only."""
    shutil.copytree(three, directory)
    shutil.rmtree(directory / "validation")
    spec = yaml.safe_load(open(directory / "feature_spec.yaml"))
    del spec["source_spec"]["validation"]
    yaml.safe_dump(spec, open(directory / "feature_spec.yaml", "w"), sort_keys=False)
    return directory


def test_main_chooses_on_validation_and_never_on_test(tmp_path):
    three = make_three_splits(tmp_path / "three")
    # The model of tests/train/test_keep_best.py: its AUC peaks before the end of the 4 epochs.
    flags = ["--embedding_dim=8", "--bottom_mlp_dims=16,8", "--top_mlp_dims=32,1", "--batch_size=256", "--epochs=4",
             "--evals_per_epoch=2", "--embedding_optimizer=lazy_adam", "--embedding_learning_rate=0.05",
             "--optimizer=adam", "--dense_learning_rate=0.01", "--seed=5"]

    # train/validation/test: the validation split chooses, test is reported once, at the chosen state.
    chosen = run_python(["main.py", f"--dataset_path={three}", *flags, "--keep_best", f"--log_path={tmp_path / 'a.jsonl'}"])
    log = events(tmp_path / "a.jsonl")
    evals, final = [e for e in log if e["event"] == "eval"], log[-1]
    best = max(evals, key=lambda e: e["auc"])
    assert (final["split"], final["selected_on"], final["test_split"]) == ("validation", "validation", "test")
    assert final["best_step"] == best["step"] < evals[-1]["step"] and final["auc"] == best["auc"]
    (tested,) = [e for e in log if e["event"] == "final_test"]
    assert tested["split"] == "test" and tested["step"] == best["step"] and final["test_auc"] == tested["auc"]
    assert f"step {best['step']}, the best auc on validation" in chosen.stdout + chosen.stderr
    assert "validation AUC" in chosen.stdout + chosen.stderr and "test AUC" in chosen.stdout + chosen.stderr

    # train/test: evaluated on test, nothing chooses: the figures are the last state's, not the best's.
    two = without_validation(three, tmp_path / "two")
    last = run_python(["main.py", f"--dataset_path={two}", *flags, f"--log_path={tmp_path / 'b.jsonl'}"])
    log = events(tmp_path / "b.jsonl")
    evals, final = [e for e in log if e["event"] == "eval"], log[-1]
    assert max(e["auc"] for e in evals) > evals[-1]["auc"] + 1e-4, "the test AUC did not peak early"
    assert final["auc"] == evals[-1]["auc"] and final["steps"] == evals[-1]["step"]
    assert (final["split"], final["selected_on"]) == ("test", None) and "best_step" not in final
    assert "test_auc" not in final and not [e for e in log if e["event"] == "final_test"]
    output = last.stdout + last.stderr
    # --calibration (on by default) is never fitted on the held-out split: the figures are the model's own.
    assert final["calibrated"] is None and "uncalibrated_logloss" not in final
    assert "calibration: not fitted: the evaluated split 'test' is the held-out test split" in output
    assert f"step {final['steps']}, the last (nothing chose it)" in output and "test AUC" in output
    assert "validation AUC" not in output

    # Asked to choose there: refused before training, in one line naming the flag that allows it.
    refused = run_python(["main.py", f"--dataset_path={two}", *flags, "--keep_best"], check=False)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "--keep_best would choose by the 'test' split" in refused.stderr and "--select_on_test" in refused.stderr
    # ... and allowed with --select_on_test, which the final line records.
    run_python(["main.py", f"--dataset_path={two}", *flags, "--keep_best", "--select_on_test",
                f"--log_path={tmp_path / 'c.jsonl'}"])
    log = events(tmp_path / "c.jsonl")
    evals, final = [e for e in log if e["event"] == "eval"], log[-1]
    best = max(evals, key=lambda e: e["auc"])
    assert (final["split"], final["selected_on"], final["best_step"]) == ("test", "test", best["step"])
    assert final["auc"] == best["auc"]
