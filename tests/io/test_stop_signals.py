"""A tool stopped by a signal leaves nothing running and no scratch directory, whichever way it ends: the clean
stop of a first signal and the at-once end of a second both leave through ``os._exit``, which skips ``atexit`` and
orphans any child process (a Spark JVM caught starting keeps running for a minute)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import REPO, worker_env

# A tool that keeps a scratch directory until its end and has started a child that knows nothing of its parent.
TOOL = textwrap.dedent("""
    import subprocess, sys, tempfile, time
    from tf_dlrm.io import stop_signals

    with stop_signals.stopping_cleanly("tool"):
        scratch = tempfile.mkdtemp(prefix="scratch_")
        stop_signals.remove_when_ending(scratch)
        child = subprocess.Popen(["sleep", "600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(scratch, child.pid, flush=True)
        try:
            time.sleep(600)
        finally:
            if sys.argv[1] == "stuck":
                time.sleep(600)  # a clean-up that never ends: only a second signal ends the tool
""")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


@pytest.mark.parametrize("clean_up", ["ends", "stuck"])
def test_a_stopped_tool_leaves_no_child_and_no_scratch_directory(tmp_path, clean_up):
    process = subprocess.Popen([sys.executable, "-c", TOOL, clean_up], cwd=REPO,
                               env=worker_env({"TMPDIR": str(tmp_path)}), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    scratch, child = process.stdout.readline().split()
    assert os.path.isdir(scratch) and alive(int(child))
    process.send_signal(signal.SIGTERM)
    if clean_up == "stuck":
        time.sleep(1)
        assert process.poll() is None  # in its clean-up
        process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 143, stderr
    deadline = time.monotonic() + 5
    while alive(int(child)) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = alive(int(child))
    if left:
        os.kill(int(child), signal.SIGKILL)
    assert not left, "the tool's child outlived it"
    assert os.listdir(tmp_path) == [], "the scratch directory outlived the tool"


def test_descendants_lists_grandchildren_before_any_ends():
    from tf_dlrm.io.stop_signals import descendants, kill_all

    shell = subprocess.Popen(["sh", "-c", "sleep 600 & sleep 600 & wait"])
    try:
        deadline = time.monotonic() + 10
        while len(descendants(shell.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        found = descendants()
        assert shell.pid in found and len(descendants(shell.pid)) == 2
        assert found.index(shell.pid) < min(found.index(pid) for pid in descendants(shell.pid))
    finally:
        kill_all(descendants(shell.pid) + [shell.pid])
        shell.wait(timeout=10)
