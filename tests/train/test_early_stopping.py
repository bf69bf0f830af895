"""``--early_stopping_patience``, ``--eval_every_steps`` and ``--eval_max_batches`` in one small run.

The model and data of ``test_keep_best.py`` (a validation AUC that peaks before the end): evaluated
every 5 steps on the first 4 batches of 256 rows, the run must stop exactly at the evaluation where
a reference count of evaluations without an improvement of more than ``min_delta`` reaches the
patience, end with the best evaluation's state (its checkpoint re-evaluates to the same AUC), and
each evaluation must count 1,024 rows and say it is partial.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest

from conftest import REPO, make_synthetic_small, run_python
from tf_dlrm.checkpoint import store as checkpoint_store
from tf_dlrm.checkpoint.checkpointer import DELAY_ENV

sys.path.insert(0, os.path.join(REPO, "tests", "bad_inputs"))
from test_signals import LINE, run_until_training_then_signal  # noqa: E402

PATIENCE, EVERY, MAX_BATCHES, VALID_BATCH, MIN_DELTA = 2, 5, 4, 256, 0.002


def events(path) -> list[dict]:
    return [json.loads(line) for line in open(path, encoding="utf-8").read().splitlines()]


def reference_stop(evals: list[dict]) -> tuple[int, int]:
    """(index of the evaluation that stops, index of the best one) by the rule the flags describe."""
    best, waited = 0, 0
    for index, record in enumerate(evals[1:], start=1):
        if record["auc"] > evals[best]["auc"] + MIN_DELTA:
            best, waited = index, 0
        else:
            waited += 1
            if waited == PATIENCE:
                return index, best
    raise AssertionError(f"no early stop by the reference rule: {[e['auc'] for e in evals]}")


def test_early_stopping_every_k_steps_on_partial_evaluations(tmp_path):
    data = make_synthetic_small(tmp_path / "data", seed=3, num_train=4000, num_valid=4000)
    flags = [
        f"--dataset_path={data}", "--embedding_dim=8", "--bottom_mlp_dims=16,8", "--top_mlp_dims=32,1", "--batch_size=256",
        f"--valid_batch_size={VALID_BATCH}", "--epochs=4", "--embedding_optimizer=lazy_adam",
        "--embedding_learning_rate=0.05", "--optimizer=adam", "--dense_learning_rate=0.01", "--seed=5",
        f"--eval_max_batches={MAX_BATCHES}",
        # The trajectory this test's checks were found on (an evaluation within MIN_DELTA after the best): without
        # the rare-id regularizer, which changes every step's update.
        "--embedding_frequency_l2=0", "--embedding_min_count=1",
    ]
    save = tmp_path / "checkpoints"
    trained = run_python(["main.py", *flags, f"--eval_every_steps={EVERY}", f"--early_stopping_patience={PATIENCE}",
                          f"--early_stopping_min_delta={MIN_DELTA}", f"--save_checkpoint_path={save}",
                          f"--log_path={tmp_path / 'train.jsonl'}"])
    log = events(tmp_path / "train.jsonl")
    evals = [e for e in log if e["event"] == "eval"]
    # Every EVERY steps, from the first, with no end-of-training evaluation (stopped before the end: 60 steps).
    assert [e["step"] for e in evals] == [EVERY * (i + 1) for i in range(len(evals))]
    assert evals[-1]["step"] < 4 * (4000 // 256)
    assert all(e["samples"] == MAX_BATCHES * VALID_BATCH and e["partial"] is True for e in evals), evals
    assert f"partial: the first {MAX_BATCHES} of 16 batches" in trained.stderr
    stop, best = reference_stop(evals)
    assert stop == len(evals) - 1, ([e["auc"] for e in evals], stop)
    assert stop - best == PATIENCE
    # An evaluation after the best beat its AUC by less than MIN_DELTA: not an improvement, neither for
    # the count nor for the state kept (a plain maximum would have kept that later one).
    assert any(evals[best]["auc"] < e["auc"] <= evals[best]["auc"] + MIN_DELTA for e in evals[best + 1:]), evals
    stopped = [e for e in log if e["event"] == "early_stop"]
    assert len(stopped) == 1 and stopped[0]["step"] == evals[-1]["step"] and stopped[0]["best_step"] == evals[best]["step"]
    final = log[-1]
    assert final["best_step"] == evals[best]["step"] and final["auc"] == evals[best]["auc"] and final["partial"] is True
    assert final["steps"] == evals[-1]["step"]
    # The saved state is the best evaluation's: the same partial evaluation of the checkpoint gives its AUC.
    run_python(["main.py", *flags, "--mode=eval", f"--restore_checkpoint_path={save}", f"--log_path={tmp_path / 'eval.jsonl'}"])
    evaluated = events(tmp_path / "eval.jsonl")[-1]
    assert evaluated["steps"] == evals[best]["step"] and evaluated["samples"] == MAX_BATCHES * VALID_BATCH
    assert abs(evaluated["auc"] - evals[best]["auc"]) <= 1e-6, (evaluated, evals[best])
    assert abs(evaluated["uncalibrated_ne"] - evals[best]["ne"]) <= 1e-5, (evaluated, evals[best])
    assert abs(evaluated["ne"] - final["ne"]) <= 1e-5, (evaluated, final)  # with the calibration fitted at the end
    # Early stopping counts evaluations of a validation split: without one, refused before training.
    blind = run_python(["main.py", *flags, "--valid_split=", "--early_stopping_patience=2"], check=False)
    assert blind.returncode == 2 and "--early_stopping_patience=2 counts evaluations of the validation split" in blind.stderr

    # Interrupted right after the best evaluation, then resumed: the same stop, the same choice.
    check_interrupted_and_resumed(tmp_path, flags, evals, evals[best]["step"], evals[-1]["step"])


def check_interrupted_and_resumed(tmp_path, flags, evals, best_step, stop_step):
    """SIGTERM as soon as the best evaluation is printed. Saves every 7 steps, slowed to about a second
    each (0.05 s per array, so that the signal lands before the stop, 10 steps later), rarely fall on
    the best step (a multiple of 5): the best state lies in memory only, and the interrupted run saves
    it beside its last state.
    The resumed run takes back the count of evaluations since the best, stops at the reference's step,
    reads the best state back from its checkpoint, and leaves it as the newest."""
    save, log = tmp_path / "interrupted", tmp_path / "resumed.jsonl"
    common = [*flags, f"--eval_every_steps={EVERY}", f"--early_stopping_patience={PATIENCE}",
              f"--early_stopping_min_delta={MIN_DELTA}", f"--save_checkpoint_path={save}", "--checkpoint_every_steps=7",
              "--keep_checkpoints=1"]
    code, output = run_until_training_then_signal(
        [sys.executable, "main.py", *common], signal.SIGTERM, env={DELAY_ENV: "0.05"}, when=f"eval at step {best_step}:",
        settle=0.3)
    assert code == 143, output[-3000:]
    stopped = int(LINE.findall(output)[0][0])
    assert best_step < stopped < stop_step, (best_step, stopped, stop_step, output[-3000:])
    on_disk = [step for step, _ in checkpoint_store.list_checkpoints(str(save))]
    assert on_disk[-1] == stopped and best_step in on_disk, on_disk  # the last state, and the best beside it
    assert checkpoint_store.read_manifest(str(save / checkpoint_store.checkpoint_name(stopped)))["selection"][
        "best_step"] == best_step
    resumed = run_python(["main.py", *common, "--resume", f"--log_path={log}"])
    assert f"keep_best: the best evaluation before the resume was step {best_step}" in resumed.stderr, resumed.stderr[-3000:]
    after = events(log)
    stop = [e for e in after if e["event"] == "early_stop"]
    assert len(stop) == 1 and stop[0]["step"] == stop_step and stop[0]["best_step"] == best_step, stop
    final = after[-1]
    reference = next(e for e in evals if e["step"] == best_step)
    assert final["best_step"] == best_step and abs(final["auc"] - reference["auc"]) <= 1e-6, (final, reference)
    # The newest checkpoint is the best state; those of the later, rejected states are gone.
    assert [step for step, _ in checkpoint_store.list_checkpoints(str(save))] == [best_step]


def test_both_evaluation_schedules_are_refused_naming_both_flags():
    """Refused as main.py parses its flags, before anything runs (main.py prints the ValueError as its
    one error line with exit code 2, as for the refusal above)."""
    from tf_dlrm.cli import main as cli  # defines main.py's flags on absl's FLAGS
    from tf_dlrm.cli.flags import config_from_flags

    cli.FLAGS.unparse_flags()
    cli.FLAGS(["main.py", "--dataset_path=/nowhere", "--evals_per_epoch=2", f"--eval_every_steps={EVERY}"])
    try:
        with pytest.raises(ValueError) as refused:
            config_from_flags(cli.FLAGS)
    finally:
        cli.FLAGS.unparse_flags()
    assert "Expected one of --evals_per_epoch and --eval_every_steps" in str(refused.value)
    assert "Received: --evals_per_epoch=2 --eval_every_steps=5" in str(refused.value)
