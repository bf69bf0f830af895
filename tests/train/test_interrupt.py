"""The stop watchdog (tf_dlrm/train/interrupt.py): a training step that never returns to Python (stuck in
a TensorFlow op, as in the input reader or a collective) still ends in bounded time after SIGTERM, with
one line and exit 143; an evaluation or a save in progress is not taken for a stuck step."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import REPO, worker_env

pytestmark = pytest.mark.slow

# A dequeue from an empty queue blocks inside TensorFlow, the GIL released: the Python-level handler
# never runs, as in a step waiting for a rank that will never answer.
STUCK = textwrap.dedent("""
    import sys, time
    import tensorflow as tf
    from tf_dlrm.train.interrupt import SignalStop

    stop = SignalStop(stuck_after_s=2).install()
    stop.training = True
    stop.last_checkpoint = lambda: "/ckpt/ckpt-00000004"
    stop.watch_steps(True)
    queue = tf.queue.FIFOQueue(1, tf.int32)
    if sys.argv[1] == "paused":
        with stop.paused():
            print("working", flush=True)
            time.sleep(6)  # a save longer than the timeout
        print("save done", flush=True)
        stop.watch_steps(False)
        sys.exit(0)
    print("working", flush=True)
    queue.dequeue()
""")


def start(kind):
    process = subprocess.Popen([sys.executable, "-c", STUCK, kind], cwd=REPO, env=worker_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "working", process.communicate()[1][-3000:]
    return process


def test_a_stuck_step_ends_within_the_timeout_after_sigterm():
    process = start("stuck")
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 143, stderr[-3000:]
    assert time.monotonic() - signalled < 30
    assert stderr.strip().splitlines()[-1] == (
        "error (rank 0): no training step ended within 2 s of SIGTERM (the step is stuck in the input reader, or in a "
        "collective waiting for another rank; --stop_timeout_s): stopped without saving; last checkpoint: "
        "/ckpt/ckpt-00000004")


def test_a_save_in_progress_is_not_a_stuck_step():
    process = start("paused")
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0 and "save done" in stdout, stderr[-3000:]
