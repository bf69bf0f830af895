"""SIGTERM and SIGKILL to ``python -m preprocessing.criteo`` while its workers run: SIGTERM ends
the workers and removes the temporary output (exit 143, one line); after a SIGKILL the workers end with
their parent and the next run removes the temporary output the killed one left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, alive, worker_env

sys.path.insert(0, os.path.join(REPO, "benchmarks"))
from preprocess_throughput import generate  # noqa: E402

pytestmark = pytest.mark.slow


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                if entry.isdigit() and int(handle.read().rsplit(b")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
        except (OSError, ValueError, IndexError):
            pass
    return found


@pytest.fixture(scope="module")
def raw_log(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("raw") / "day_0.tsv")
    generate(path, 150_000, seed=3)
    return path


def start_and_signal_once_working(raw_log, output, number) -> tuple[subprocess.Popen, list[int], str]:
    process = subprocess.Popen([sys.executable, "-m", "preprocessing.criteo", f"--input={raw_log}",
                                f"--output_dir={output}", "--num_workers=2"], cwd=REPO, env=worker_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers, deadline = [], time.time() + 120
    while not workers and time.time() < deadline and process.poll() is None:
        workers = children(process.pid)
        time.sleep(0.02)
    assert workers, "no worker process started"
    time.sleep(0.3)  # the pass is under way
    process.send_signal(number)
    _, stderr = process.communicate(timeout=120)
    return process, workers, stderr


def temporaries(output) -> list[str]:
    parent, name = os.path.split(str(output))
    return [entry for entry in os.listdir(parent) if entry.startswith(f".{name}.tmp-")]


def test_sigterm_ends_the_workers_and_removes_the_temporary_output(raw_log, tmp_path):
    output = tmp_path / "out"
    process, workers, stderr = start_and_signal_once_working(raw_log, output, signal.SIGTERM)
    assert process.returncode == 143, stderr[-3000:]
    assert "preprocessing.criteo: stopped by SIGTERM; nothing was published" in stderr, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    time.sleep(1)
    assert not [pid for pid in workers if alive(pid)], "workers outlived the tool"
    assert temporaries(output) == [] and not output.exists()


def test_after_sigkill_the_workers_end_and_a_rerun_cleans_up(raw_log, tmp_path):
    output = tmp_path / "out"
    process, workers, _ = start_and_signal_once_working(raw_log, output, signal.SIGKILL)
    assert process.returncode == -signal.SIGKILL
    deadline = time.time() + 30
    while [pid for pid in workers if alive(pid)] and time.time() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in workers if alive(pid)], "workers outlived their killed parent"
    left = temporaries(output)
    assert left, "the killed run left no temporary output (nothing to clean up: the test proves nothing)"
    rerun = subprocess.run([sys.executable, "-m", "preprocessing.criteo", f"--input={raw_log}",
                            f"--output_dir={output}", "--num_workers=2"], cwd=REPO, env=worker_env(),
                           capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert temporaries(output) == [] and (output / "feature_spec.yaml").is_file()
