"""SIGINT and SIGTERM, in one process and under horovodrun: a checkpoint, one line, 130/143, no traceback."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import HOROVODRUN, REPO, worker_env
from tiny_dataset import TINY_MODEL, write_tiny
from tf_dlrm.checkpoint import store as checkpoint_store

pytestmark = pytest.mark.slow
LONG_RUN = ["--epochs=100000", "--evals_per_epoch=0", "--print_freq=5"]
EXIT_RECORDER = os.path.join(REPO, "tests", "bad_inputs", "exit_recorder.py")
LINE = re.compile(r"interrupted at step (\d+); last checkpoint: (\S+)")


def run_until_training_then_signal(command, number, timeout=240):
    """Starts ``command``, waits for its first progress line, sends ``number``; returns (exit code, output)."""
    process = subprocess.Popen(command, cwd=REPO, env=worker_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    lines, started = [], threading.Event()

    def collect():
        for line in process.stdout:
            lines.append(line)
            if " loss " in line:
                started.set()

    reader = threading.Thread(target=collect, daemon=True)
    reader.start()
    assert started.wait(timeout), "".join(lines)[-3000:]
    time.sleep(0.5)  # a few more steps
    process.send_signal(number)
    code = process.wait(timeout=60)
    reader.join(timeout=10)
    return code, "".join(lines)


def check_checkpoint_of_line(output, save):
    matches = LINE.findall(output)
    assert len(matches) == 1, output[-3000:]  # one line, from rank 0 only
    step, path = int(matches[0][0]), matches[0][1]
    assert path == os.path.join(str(save), checkpoint_store.checkpoint_name(step)), output[-3000:]
    checkpoint_store.verify_files(path, checkpoint_store.read_manifest(path))
    assert checkpoint_store.read_manifest(path)["step"] == step > 0


@pytest.mark.parametrize("number, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_one_process_saves_and_says_one_line(tmp_path, number, code):
    data, save = write_tiny(tmp_path / "data"), tmp_path / "save"
    command = [sys.executable, "main.py", f"--dataset_path={data}", *TINY_MODEL, *LONG_RUN, f"--save_checkpoint_path={save}"]
    exit_code, output = run_until_training_then_signal(command, number)
    assert exit_code == code, output[-3000:]
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    assert output.rstrip().splitlines()[-1].startswith("interrupted at step"), output[-3000:]
    check_checkpoint_of_line(output, save)


def test_one_process_without_a_save_path_says_none(tmp_path):
    data = write_tiny(tmp_path / "data")
    command = [sys.executable, "main.py", f"--dataset_path={data}", *TINY_MODEL, *LONG_RUN]
    exit_code, output = run_until_training_then_signal(command, signal.SIGINT)
    assert exit_code == 130 and re.search(r"interrupted at step \d+; last checkpoint: none\n", output), output[-3000:]
    assert "Traceback" not in output


@pytest.mark.multirank
@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_under_horovodrun_every_rank_stops_after_the_same_step_and_saves(tmp_path, number):
    data, save, codes = write_tiny(tmp_path / "data"), tmp_path / "save", tmp_path / "exit_codes"
    codes.mkdir()
    # Each rank runs under exit_recorder.py, which records the rank's own exit status: horovodrun's
    # status after a signal is not reliable (its docstring says why).
    command = [HOROVODRUN, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, EXIT_RECORDER, str(codes),
               sys.executable, "main.py", f"--dataset_path={data}", *TINY_MODEL, *LONG_RUN,
               f"--save_checkpoint_path={save}"]
    _, output = run_until_training_then_signal(command, number)
    # horovodrun passes either signal on to the ranks as SIGTERM.
    assert {path.name: path.read_text().strip() for path in codes.iterdir()} == {"rank0": "143", "rank1": "143"}, \
        output[-3000:]
    # No rank prints a traceback (horovodrun itself raises one when a rank exits non-zero: not ours to change).
    rank_lines = [line for line in output.splitlines() if re.match(r"\[\d\]<std(err|out)>:", line)]
    assert not [line for line in rank_lines if "Traceback" in line], output[-5000:]
    check_checkpoint_of_line(output, save)
