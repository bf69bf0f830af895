"""A failed or interrupted pass ends its worker pool in bounded time, even when the pool's feeder thread
is blocked writing a task into the full pipe that only the (ended) workers read; and a second stop
signal ends a tool at once, removing its temporary output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import REPO, signal_when_ready, worker_env

pytestmark = pytest.mark.slow

# One worker sleeps in its task while the feeder thread writes a task larger than a pipe's buffer
# that nobody reads; then the pass fails.
BLOCKED_FEEDER = textwrap.dedent("""
    import time
    from preprocessing.local_engine import LocalEngine

    def slow(payload):
        time.sleep(600)

    engine = LocalEngine(num_workers=1)
    try:
        with engine._executor() as executor:
            for _ in range(4):
                executor.submit(slow, b"x" * (4 << 20))
            time.sleep(2)
            raise RuntimeError("the pass failed")
    except RuntimeError as error:
        print("ended:", error, flush=True)
""")


def test_a_failed_pass_never_waits_on_its_terminated_workers():
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", BLOCKED_FEEDER], cwd=REPO, env=worker_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "ended: the pass failed" in result.stdout, result.stderr[-3000:]
    assert time.monotonic() - started < 60


STUCK_CLEAN_UP = textwrap.dedent("""
    import sys, time
    from tf_dlrm.io import publish
    from tf_dlrm.io.stop_signals import stopping_cleanly

    with stopping_cleanly("tool"):
        with publish.staged_output(sys.argv[1], "--output_dir", "tool") as workspace:
            try:
                print("writing", flush=True)
                time.sleep(600)
            finally:
                time.sleep(600)  # a clean-up that never ends
""")


def test_a_second_signal_ends_a_stuck_clean_up_at_once(tmp_path):
    output = tmp_path / "out"
    process = subprocess.Popen([sys.executable, "-c", STUCK_CLEAN_UP, str(output)], cwd=REPO, env=worker_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "writing"
    assert [e for e in os.listdir(tmp_path) if e.startswith(".out.tmp-")]
    process.send_signal(signal.SIGTERM)
    time.sleep(1)
    assert process.poll() is None  # in its clean-up
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 143, stderr
    assert "stopped at once by a second SIGTERM; the temporary output was removed, nothing was published" in stderr
    assert os.listdir(tmp_path) == []


# A thread the interpreter would join at exit and that never ends, as a worker pool's manager thread
# blocked on a pipe its ended workers no longer read.
STUCK_THREAD = textwrap.dedent("""
    import threading, time
    from tf_dlrm.io.stop_signals import stopping_cleanly

    with stopping_cleanly("tool"):
        threading.Thread(target=time.sleep, args=(600,)).start()
        print("working", flush=True)
        time.sleep(600)
""")


def test_a_stopped_tool_exits_whatever_threads_are_left():
    status, _, stderr = signal_when_ready(STUCK_THREAD, "working", timeout=30)
    assert status == 143, stderr
    assert stderr.strip() == "tool: stopped by SIGTERM; nothing was published (an earlier output is as it was)"
