"""benchmarks/chaos.py keeps working: a tiny job, two faults that each need a restart (a lost rank under the launch
module, a crash that truncates the newest checkpoint), and the final AUC equal to the uninterrupted run's.

Kept within a minute: 80 steps (the seed strikes at steps 16 and about 48, each with room for the job to get going
again before its end), and the uninterrupted run beside the faulty one (--reference_alongside) instead of before it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, worker_env

pytestmark = pytest.mark.slow


def test_two_faults_are_survived_and_the_auc_is_the_uninterrupted_runs(tmp_path):
    result = subprocess.run(
        [sys.executable, "benchmarks/chaos.py", "--faults=2", "--seed=672", "--faults_per_round=2",
         "--kinds=rank_sigkill,crash_corrupt_newest", "--train_samples=16384", "--epochs=5",
         "--checkpoint_every_steps=8", "--tmpfs_mib=0", "--reference_alongside", f"--work_dir={tmp_path}"],
        cwd=REPO, env=worker_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    faults = [line for line in lines if "fault" in line and line.get("injected")]
    summary = lines[-1]
    assert summary["benchmark"] == "chaos" and summary["faults"] == 2 == len(faults), lines
    assert all(fault["survived"] and fault["restarts"] >= 1 for fault in faults), faults
    assert sorted(fault["kind"] for fault in faults) == ["crash_corrupt_newest", "rank_sigkill"], faults
    crash = next(fault for fault in faults if fault["kind"] == "crash_corrupt_newest")
    assert crash["truncated"] is not None and crash["resumed_from"] < crash["step"], crash  # set aside, an older one restored
    assert summary["rounds_auc_equal"] == summary["rounds"] == 1 and summary["half_written_listed"] == 0, summary
    assert not os.path.ismount(tmp_path / "checkpoints")
