"""scripts/train_resilient.sh passes SIGTERM and SIGINT on to the job, once, and exits with the job's status without a
restart. Before, the script only noted the signal (bash runs a trap after the foreground command ends) and the job
trained on to its end: a scheduler's preemption never reached the ranks. And a script started with SIGINT ignored (a
background command of a non-interactive shell, ``train_resilient.sh ... &`` in a script: bash ignores SIGINT and SIGQUIT
for it, and a signal ignored when bash starts cannot be trapped) let SIGINT pass by: the job trained to its end and the
script exited 0 (benchmarks/results/chaos.md, fault 17).

The job here is a stand-in launcher (``PYTHON`` and ``HOROVODRUN`` both name it): it says which signals it got."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from conftest import REPO, worker_env

STAND_IN = """#!{python}
import signal, sys, time

def stop(number, frame):
    print(f"job got {{signal.Signals(number).name[3:]}}", flush=True)
    sys.exit(128 + number)

signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
print("job started", flush=True)
time.sleep(60)
"""


def _ignoring_stop_signals() -> None:
    """As a non-interactive shell starts a background command (SIGINT; SIGTERM too, as some supervisors do)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def start_script(tmp_path, preexec_fn=None) -> subprocess.Popen:
    """The script running the stand-in job (its group of its own), once the job has started."""
    job = tmp_path / "job"
    job.write_text(STAND_IN.format(python=sys.executable))
    job.chmod(job.stat().st_mode | stat.S_IEXEC)
    script = subprocess.Popen(["bash", "scripts/train_resilient.sh", "--np", "2", "--", "python", "main.py",
                               f"--save_checkpoint_path={tmp_path / 'save'}"], cwd=REPO,
                              env=worker_env({"PYTHON": str(job), "HOROVODRUN": str(job)}), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True, preexec_fn=preexec_fn)
    assert script.stdout.readline().startswith("train_resilient.sh: attempt 1")
    assert script.stdout.readline().strip() == "job started"
    return script


@pytest.mark.parametrize("ignored_at_start", [False, True], ids=["default", "ignored_at_start"])
@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_script_stops_the_job_once_and_no_restart_follows(tmp_path, number, ignored_at_start):
    script = start_script(tmp_path, _ignoring_stop_signals if ignored_at_start else None)
    try:
        signalled = time.monotonic()
        os.kill(script.pid, number)
        output, _ = script.communicate(timeout=30)
    finally:
        if script.poll() is None:
            os.killpg(script.pid, signal.SIGKILL)
            script.wait()
    name = signal.Signals(number).name[3:]
    assert time.monotonic() - signalled < 10, output
    assert script.returncode == 128 + number, output
    assert output.count(f"job got {name}") == 1, output
    assert "attempt 2" not in output, output
    assert output.strip().splitlines()[-1] == (f"train_resilient.sh: stopped by a signal, passed on to the job "
                                               f"(exit status {128 + number}); no restart"), output


def test_a_script_killed_outright_takes_its_job_with_it(tmp_path):
    """SIGKILL (or the out-of-memory killer) gives the script no chance to pass a signal on: the launcher gets
    SIGTERM from the kernel as the script dies (setpriv --pdeathsig) and stops the job as after a preemption.
    Before, the launcher and its ranks trained on unattended (benchmarks/results/chaos.md)."""
    script = start_script(tmp_path)
    try:
        killed = time.monotonic()
        os.kill(script.pid, signal.SIGKILL)
        # The pipe ends when the job and its tee have exited (the job writes its last line through tee).
        output, _ = script.communicate(timeout=30)
    finally:
        if script.poll() is None:
            os.killpg(script.pid, signal.SIGKILL)
            script.wait()
    assert time.monotonic() - killed < 10, output
    assert output.strip().splitlines() == ["job got TERM"], output
