"""A launcher killed outright (SIGKILL: no handler runs) takes its job with it: horovodrun and the ranks end
instead of training on unattended (benchmarks/chaos.py found three processes left after such a kill)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from conftest import REPO, alive, worker_env


def test_killing_the_launcher_ends_horovodrun_and_the_ranks():
    from tf_dlrm.cli import launch

    launcher = subprocess.Popen([sys.executable, "-m", "tf_dlrm.cli.launch", "-np", "1", "-H", "localhost:1", sys.executable,
                                 "-c", "import time; time.sleep(300)"], cwd=REPO, env=worker_env(None))
    job = []
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not job:  # horovodrun, then the rank under it
            children = launch._children(launcher.pid)
            ranks = launch.rank_processes(children[0]) if children else {}
            job = children + list(ranks.values()) if ranks else []
            time.sleep(0.2)
        assert job, "the launcher's job did not start within 60 s"
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=30)
        deadline = time.time() + 30
        while time.time() < deadline and any(alive(pid) for pid in job):
            time.sleep(0.2)
        left = [pid for pid in job if alive(pid)]
        assert not left, f"still running 30 s after the launcher's SIGKILL: {left}"
    finally:
        for pid in job + [launcher.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
