"""Resume = no interruption: a run SIGKILLed in the middle of a save resumes from the previous checkpoint.

Straight: 10 steps with ``-np 2``. Killed: the same run, rank 0 SIGKILLed while the step-10 save is
half written, then ``--resume``d: it restarts from step 5 (the half-written save is never loaded)
and its step-10 checkpoint equals the straight run's within 1e-6 (same world size: the same float
operations). Resumed from step 5 on ``-np 3`` with a table-wise plan instead: within 1e-5 (only the
order of float sums differs). Adam moments and a warmup + decay schedule make the optimizer state
and the schedule position part of what must carry over.
"""

from __future__ import annotations

import os

import pytest

from checkpoint_runs import EVERY, STEPS, ckpt, killed_and_resumed, max_difference, straight, table_wise
from tf_dlrm.checkpoint import store as checkpoint_store

pytestmark = pytest.mark.multirank


def test_a_run_killed_in_the_middle_of_a_save_resumes_from_the_previous_checkpoint(tmp_path_factory):
    run = killed_and_resumed(tmp_path_factory)
    on_disk = run["on_disk"]
    assert on_disk["killed"], "the save never got half-way: nothing was killed"
    assert on_disk["exit_code"] not in (0, "hung"), f"horovodrun exit code after the kill: {on_disk['exit_code']}"
    # At the kill: step 5 published, step 10 only as a hidden temporary directory.
    assert f"ckpt-{EVERY:08d}" in on_disk["listing"] and f".ckpt-{STEPS:08d}.tmp" in on_disk["listing"]
    assert f"ckpt-{STEPS:08d}" not in on_disk["listing_after_exit"]
    restored = [e for e in run["events"] if e["event"] == "checkpoint_restored"]
    assert len(restored) == 1 and restored[0]["step"] == EVERY
    assert restored[0]["path"].endswith(f"ckpt-{EVERY:08d}")
    final = run["events"][-1]
    assert final["event"] == "final" and final["steps"] == STEPS
    # The resumed run cleaned the temporary directory and published a complete step 10.
    assert sorted(os.listdir(run["save"])) == [".lock", f"ckpt-{EVERY:08d}", f"ckpt-{STEPS:08d}", "latest"]
    directory = ckpt(run["save"], STEPS)
    checkpoint_store.verify_files(directory, checkpoint_store.read_manifest(directory))


def test_kill_and_resume_equals_training_straight_through(tmp_path_factory):
    resumed = killed_and_resumed(tmp_path_factory)
    reference = straight(tmp_path_factory)
    difference, where = max_difference(ckpt(resumed["save"], STEPS), ckpt(reference["save"], STEPS))
    assert difference <= 1e-6, f"largest difference {difference} in {where}"


def test_resuming_on_another_world_size_equals_training_straight_through(tmp_path_factory):
    resumed = table_wise(tmp_path_factory)
    reference = straight(tmp_path_factory)
    # Tolerance 1e-5: 3 ranks sum the same gradients in another order than 2.
    difference, where = max_difference(ckpt(resumed["save"], STEPS), ckpt(reference["save"], STEPS))
    assert difference <= 1e-5, f"largest difference {difference} in {where}"
    mine = checkpoint_store.read_manifest(ckpt(resumed["save"], STEPS))
    theirs = checkpoint_store.read_manifest(ckpt(reference["save"], STEPS))
    assert mine["position"] == theirs["position"]
    assert mine["learning_rate"] == pytest.approx(theirs["learning_rate"], abs=1e-9)
    assert mine["saved_world_size"] == 3 and theirs["saved_world_size"] == 2
