"""--mode=eval and --mode=inference on a checkpoint, and the checks of the checkpoint flags."""

from __future__ import annotations

import json
import math
import os
import sys

import pytest

# checkpoint_runs (beside test_checkpoint.py) caches the launches these files share.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "checkpoint"))
from checkpoint_runs import STEPS, single  # noqa: E402

pytestmark = pytest.mark.multirank


def _events(path):
    with open(path) as handle:
        return [json.loads(line) for line in handle]


def test_eval_mode_reports_the_metrics_of_the_latest_checkpoint(tmp_path_factory):
    run = single(tmp_path_factory)
    final = _events(os.path.join(run["out"], "eval.jsonl"))[-1]
    predicted = run["results"]["predict"]
    assert final["event"] == "final" and final["mode"] == "eval" and final["steps"] == STEPS
    assert final["checkpoint"].endswith(f"ckpt-{STEPS:08d}")
    assert final["samples"] == 1500
    assert final["auc"] == pytest.approx(predicted["auc"], abs=1e-9)
    assert final["logloss"] == pytest.approx(predicted["logloss"], abs=1e-9)
    # NE, calibration and the positive rate of the same evaluation, as the training loop reports them.
    assert {k: final[k] for k in ("ne", "calibration", "positive_rate")} == {
        k: predicted["metrics"][k] for k in ("ne", "calibration", "positive_rate")}
    rate = final["positive_rate"]
    assert final["ne"] == pytest.approx(final["logloss"] / -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate)), rel=1e-12)


def test_inference_mode_logs_latency_percentiles_and_throughput(tmp_path_factory):
    run = single(tmp_path_factory)
    events = _events(os.path.join(run["out"], "inference.jsonl"))
    timed = [e for e in events if e["event"] == "inference"]
    assert [e["batch_size"] for e in timed] == [1, 64, 384]
    for event in timed:
        assert event["batches"] == 20
        assert 0 < event["p50_ms"] <= event["p90_ms"] <= event["p99_ms"]
        assert event["mean_ms"] > 0
        assert event["samples_per_s"] == pytest.approx(event["batch_size"] / event["mean_ms"] * 1e3)
    assert events[-1]["event"] == "final" and [r["batch_size"] for r in events[-1]["results"]] == [1, 64, 384]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--mode=eval"], "--mode=eval needs a checkpoint"),
        (["--mode=export", "--restore_checkpoint_path=x"], "--mode=export needs --saved_model_path"),
        (["--resume"], "--resume continues from the latest checkpoint under --save_checkpoint_path"),
        (["--keep_checkpoints=0", "--save_checkpoint_path=x"], "Expected --keep_checkpoints >= 1"),
        (["--checkpoint_every_steps=5"], "--checkpoint_every_steps needs --save_checkpoint_path"),
    ],
)
def test_checkpoint_flags_are_checked(flags, message):
    from tf_dlrm.cli import main as cli
    from tf_dlrm.cli.flags import config_from_flags

    cli.FLAGS.unparse_flags()
    cli.FLAGS(["main.py", "--dataset_path=/nonexistent", *flags])
    try:
        with pytest.raises(ValueError, match=message.replace("(", r"\(")):
            config_from_flags(cli.FLAGS)
    finally:
        cli.FLAGS.unparse_flags()
