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

from conftest import REPO, alive, signal_when_ready, worker_env

# A tool that keeps a scratch directory until its end and has started a child that knows nothing of its parent.
TOOL = textwrap.dedent("""
    import subprocess, sys, tempfile, time
    from tf_dlrm.io import stop_signals

    with stop_signals.stopping_cleanly("tool"):
        scratch = tempfile.mkdtemp(prefix="scratch_")
        stop_signals.remove_when_ending(scratch)
        child = subprocess.Popen(["sleep", "600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:  # the ready line is printed inside: a signal sent the moment it is read must land in this try
            print(scratch, child.pid, flush=True)
            time.sleep(600)
        finally:
            if sys.argv[1] == "stuck":
                time.sleep(600)  # a clean-up that never ends: only a second signal ends the tool
""")


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


# Publishes twice into one directory; a SIGTERM comes at the moment named by argv[2]: between the two renames that
# swap the second output in ("swap"), or while the earlier output, renamed aside, is being removed ("removal").
PUBLISH_TWICE = textwrap.dedent("""
    import os, shutil, signal, sys
    from tf_dlrm.io import publish
    from tf_dlrm.io.stop_signals import stopping_cleanly

    output, moment = sys.argv[1], sys.argv[2]
    real_rename, real_rmtree = os.rename, shutil.rmtree

    def rename(source, target):
        real_rename(source, target)
        if moment == "swap" and ".old-" in target:
            os.kill(os.getpid(), signal.SIGTERM)  # handled before the next rename

    def rmtree(path, *args, **kwargs):
        if moment == "removal" and ".old-" in str(path) and not getattr(rmtree, "signalled", False):
            rmtree.signalled = True
            os.kill(os.getpid(), signal.SIGTERM)  # handled before anything is removed
        return real_rmtree(path, *args, **kwargs)

    with stopping_cleanly("tool"):
        for text in ("first", "second"):
            with publish.staged_output(output, "--output_dir", "tool") as workspace:
                with open(os.path.join(workspace, "data.txt"), "w") as handle:
                    handle.write(text)
            if text == "first":
                os.rename, shutil.rmtree = rename, rmtree
""")


@pytest.mark.parametrize("moment", ["swap", "removal"])
def test_a_signal_while_an_output_is_swapped_in_leaves_it_whole_and_nothing_aside(tmp_path, moment):
    output = tmp_path / "out"
    result = subprocess.run([sys.executable, "-c", PUBLISH_TWICE, str(output), moment], cwd=REPO, env=worker_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 143, result.stderr
    assert result.stderr.strip().splitlines()[-1] == f"tool: stopped by SIGTERM after its output was published: {output}"
    assert (output / "data.txt").read_text() == "second"
    assert sorted(os.listdir(tmp_path)) == ["out"], "something was left beside the output"


# The signal lands while a finalizer runs: Python prints the handler's exception as ignored and goes on.
SIGNAL_IN_A_FINALIZER = textwrap.dedent("""
    import time
    from tf_dlrm.io import stop_signals

    class Finalized:
        def __del__(self):
            print("finalizing", flush=True)
            end = time.monotonic() + 2
            while time.monotonic() < end:  # Python code: the handler runs in here
                pass

    with stop_signals.stopping_cleanly("tool"):
        Finalized()
        for _ in range(200):  # the tool's work, checking between pieces
            stop_signals.check()
            time.sleep(0.05)
        print("ran to the end", flush=True)
""")


def test_a_signal_whose_exception_a_finalizer_dropped_still_stops_the_tool():
    status, stdout, stderr = signal_when_ready(SIGNAL_IN_A_FINALIZER, "finalizing")
    assert "Exception ignored" in stderr, "the signal did not land in the finalizer: the test proves nothing"
    assert status == 143 and "ran to the end" not in stdout, stderr
    assert stderr.strip().splitlines()[-1] == "tool: stopped by SIGTERM; nothing was published (an earlier output is as it was)"


# The stop's unwinding meets an error of its own making (a call on a connection the stop cut, as a Spark engine's).
ERROR_WHILE_STOPPING = textwrap.dedent("""
    import time
    from tf_dlrm.io import stop_signals

    with stop_signals.stopping_cleanly("tool"):
        try:
            print("working", flush=True)
            time.sleep(600)
        finally:
            raise RuntimeError("a call on the connection the stop cut")
""")


def test_an_error_raised_while_the_stop_unwinds_is_reported_as_the_stop():
    status, _, stderr = signal_when_ready(ERROR_WHILE_STOPPING, "working")
    assert status == 143 and "Traceback" not in stderr, stderr
    assert stderr.strip() == "tool: stopped by SIGTERM; nothing was published (an earlier output is as it was)"
