"""scripts/train_resilient.sh: a job that loses a rank finishes on the remaining one, from its newest
intact checkpoint, with the AUC of a run interrupted and resumed by hand at that checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from conftest import REPO, launch, one_each, run_python, worker_env
from tiny_dataset import TINY_MODEL, write_tiny
from tf_dlrm.checkpoint import store as checkpoint_store

pytestmark = [pytest.mark.multirank, pytest.mark.slow]
STEPS, EVERY = 200, 20
FLAGS = one_each([*TINY_MODEL, "--epochs=100", f"--max_steps={STEPS}", f"--checkpoint_every_steps={EVERY}", "--evals_per_epoch=0",
                  "--print_freq=50"])


def events(log) -> list[dict]:
    return [json.loads(line) for line in open(log, encoding="utf-8").read().splitlines()]


def rank_process(root: psutil.Process, rank: str):
    try:
        children = root.children(recursive=True)
    except psutil.NoSuchProcess:  # a process of the tree exited while it was walked: look again later
        return None
    for child in children:
        try:
            if "main.py" in " ".join(child.cmdline()) and child.environ().get("HOROVOD_RANK") == rank:
                return child
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def test_a_killed_rank_is_replaced_by_a_restart_that_ends_like_a_resume_by_hand(tmp_path):
    data = write_tiny(tmp_path / "data", num_train=8192)
    save, log = tmp_path / "resilient", tmp_path / "resilient.jsonl"
    command = ["bash", "scripts/train_resilient.sh", "--np", "2", "--", sys.executable, "main.py",
               f"--dataset_path={data}", *FLAGS, f"--save_checkpoint_path={save}", f"--log_path={log}"]
    script = subprocess.Popen(command, cwd=REPO, env=worker_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    root = psutil.Process(script.pid)
    deadline = time.time() + 240
    while not os.path.isdir(save / checkpoint_store.checkpoint_name(EVERY)) and time.time() < deadline and script.poll() is None:
        time.sleep(0.02)
    victim = rank_process(root, "1")
    assert victim is not None, "rank 1 not found (the job ended before the kill?)"
    victim.kill()  # SIGKILL: the rank is lost mid-run
    output, _ = script.communicate(timeout=400)
    assert script.returncode == 0, output[-4000:]
    assert "a rank was lost" in output and "attempt 2 on 1 rank(s) (--resume)" in output, output[-4000:]
    # The surviving rank says what happened in one line, without a Python traceback.
    assert not [line for line in output.splitlines() if line.startswith("[0]<stderr>:Traceback")], output[-4000:]
    resumed = events(log)
    restored = [e for e in resumed if e["event"] == "checkpoint_restored"]
    assert len(restored) == 1 and restored[0]["step"] % EVERY == 0 and restored[0]["step"] >= EVERY, restored
    final = resumed[-1]
    assert final["event"] == "final" and final["world_size"] == 1 and final["steps"] == STEPS
    step = restored[0]["step"]

    # By hand: the same job stopped at that checkpoint on 2 ranks, then resumed on 1.
    by_hand, hand_log = tmp_path / "by_hand", tmp_path / "by_hand.jsonl"
    launch(2, ["main.py", f"--dataset_path={data}", *FLAGS, f"--save_checkpoint_path={by_hand}", f"--max_steps={step}"], timeout=300)
    run_python(["main.py", f"--dataset_path={data}", *FLAGS, f"--save_checkpoint_path={by_hand}", "--resume",
                f"--log_path={hand_log}"], timeout=300)
    reference = events(hand_log)[-1]
    assert reference["steps"] == STEPS
    print(f"restored at step {step}: resilient AUC {final['auc']!r}, resumed by hand AUC {reference['auc']!r}")
    assert abs(final["auc"] - reference["auc"]) <= 1e-4, (final, reference)
