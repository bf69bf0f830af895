"""A failure on any rank ends the whole horovodrun job with a non-zero exit in bounded time."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import HOROVODRUN, REPO, worker_env

LIMIT_SECONDS = 60


def start(args):
    command = [HOROVODRUN, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, "tests/parallel/failure_worker.py", *args]
    return subprocess.Popen(command, cwd=REPO, env=worker_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for_line(process, text, timeout):
    deadline = time.time() + timeout
    seen = []
    while time.time() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        seen.append(line)
        if text in line:
            return seen
    process.kill()
    pytest.fail(f"never saw {text!r}; output:\n{''.join(seen[-40:])}")


def rank_pid(rank: int) -> int:
    """The pid of the python worker whose environment says HOROVOD_RANK=rank."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                environ = handle.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                cmdline = handle.read()
        except OSError:
            continue
        if f"HOROVOD_RANK={rank}".encode() in environ and b"failure_worker.py" in cmdline and b"/bin/sh" not in cmdline[:10]:
            if cmdline.startswith(sys.executable.encode()) or b"python" in cmdline.split(b"\0")[0]:
                return int(pid)
    raise AssertionError(f"no worker process for rank {rank}")


@pytest.mark.multirank
def test_a_rank_that_raises_ends_the_job(tmp_path):
    process = start(["raise", "1"])
    seen = wait_for_line(process, "rank 1 step 3", timeout=300)
    failed_at = time.time()
    try:
        output, _ = process.communicate(timeout=LIMIT_SECONDS)
        # horovodrun forwards a rank's stdout and stderr in two threads: the traceback may come out
        # before the step line it follows, i.e. among the lines wait_for_line already read.
        output = "".join(seen) + output
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"horovodrun still running {LIMIT_SECONDS} s after rank 1 raised")
    assert process.returncode != 0
    assert time.time() - failed_at < LIMIT_SECONDS
    # Whichever rank horovodrun sees die first, the output says why the job ended: that rank's own lines (the
    # traceback, or Horovod's shut-down error on the other rank), or, where horovodrun ended before forwarding them
    # (its output threads race the exit it reports), its summary naming the first rank that exited, with Python's
    # status for an uncaught exception (a rank killed by a signal or crashing would show another).
    named = re.search(r"Process name: [01]\nExit code: 1\n", output)
    assert "fails on purpose" in output or "Horovod has been shut down" in output or named, output[-3000:]


@pytest.mark.multirank
def test_a_killed_rank_ends_the_job(tmp_path):
    process = start(["hang"])
    wait_for_line(process, "rank 1 step 5", timeout=300)
    os.kill(rank_pid(1), signal.SIGKILL)
    killed_at = time.time()
    try:
        process.communicate(timeout=LIMIT_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"horovodrun still running {LIMIT_SECONDS} s after rank 1 was killed")
    assert process.returncode != 0
    assert time.time() - killed_at < LIMIT_SECONDS
