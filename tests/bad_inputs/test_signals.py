"""SIGINT and SIGTERM, in one process and under horovodrun: a checkpoint, one line, 130/143, no traceback."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import HOROVODRUN, REPO, one_each, worker_env
from tiny_dataset import TINY_MODEL, write_tiny
from tf_dlrm.checkpoint import store as checkpoint_store

pytestmark = pytest.mark.slow
LONG_RUN = ["--epochs=100000", "--evals_per_epoch=0", "--print_freq=5"]
EXIT_RECORDER = os.path.join(REPO, "tests", "bad_inputs", "exit_recorder.py")
LINE = re.compile(r"interrupted at step (\d+); last checkpoint: (\S+)")


def run_until_training_then_signal(command, number, timeout=240, env=None, when=" loss ", settle=0.5):
    """Starts ``command`` (``env``: extra environment), waits for its first line holding ``when`` (a
    progress line), then ``settle`` seconds, sends ``number``; returns (exit code, output)."""
    process = subprocess.Popen(one_each(command), cwd=REPO, env=worker_env(env), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    lines, started = [], threading.Event()

    def collect():
        for line in process.stdout:
            lines.append(line)
            if when in line:
                started.set()

    reader = threading.Thread(target=collect, daemon=True)
    reader.start()
    assert started.wait(timeout), "".join(lines)[-3000:]
    time.sleep(settle)  # a few more steps
    process.send_signal(number)
    code = process.wait(timeout=180)
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


SLOW_SAVE = {"TF_DLRM_TEST_CHECKPOINT_DELAY_S": "4"}  # rank 0 sleeps 4 s after each of the 2 tables: 8 s > 5 s


@pytest.mark.multirank
def test_the_launcher_gives_a_slow_save_its_time(tmp_path):
    """SIGTERM to ``python -m tf_dlrm.cli.launch`` (horovodrun's arguments) while a save takes longer than
    horovodrun's 5 s: every rank exits 143 after saving, one line, a checkpoint of that step."""
    data, save, codes = write_tiny(tmp_path / "data"), tmp_path / "save", tmp_path / "exit_codes"
    codes.mkdir()
    command = [sys.executable, "-m", "tf_dlrm.cli.launch", "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
               EXIT_RECORDER, str(codes), sys.executable, "main.py", f"--dataset_path={data}", *TINY_MODEL, *LONG_RUN,
               f"--save_checkpoint_path={save}"]
    code, output = run_until_training_then_signal(command, signal.SIGTERM, env=SLOW_SAVE)
    assert code == 143, output[-3000:]
    assert {path.name: path.read_text().strip() for path in codes.iterdir()} == {"rank0": "143", "rank1": "143"}, \
        output[-3000:]
    assert re.search(r"tf_dlrm launch: SIGTERM: SIGTERM to the ranks on this host \(rank 0 pid \d+, rank 1 pid \d+\)",
                     output), output[-3000:]
    assert "horovodrun kills the ranks" not in output  # no warning: the launcher's ranks have the time
    check_checkpoint_of_line(output, save)


@pytest.mark.multirank
def test_plain_horovodrun_warns_that_a_slow_save_may_be_cut_short(tmp_path):
    """The same under horovodrun itself: rank 0 says at once that horovodrun may kill the save and names the
    launcher; whatever survives, a checkpoint directory is either complete or not published."""
    data, save = write_tiny(tmp_path / "data"), tmp_path / "save"
    command = [HOROVODRUN, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, "main.py", f"--dataset_path={data}",
               *TINY_MODEL, *LONG_RUN, f"--save_checkpoint_path={save}"]
    _, output = run_until_training_then_signal(command, signal.SIGTERM, env=SLOW_SAVE)
    assert output.count("horovodrun kills the ranks 5 s after it passes a signal on") == 1, output[-3000:]
    assert "python -m tf_dlrm.cli.launch" in output
    for _, path in checkpoint_store.list_checkpoints(str(save)):
        checkpoint_store.verify_files(path, checkpoint_store.read_manifest(path))


def _rank_processes() -> dict[int, int]:
    """``{rank: pid}`` of this user's running ``main.py`` ranks (read from /proc)."""
    found = {}
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                command = handle.read().split(b"\0")
            with open(f"/proc/{entry}/environ", "rb") as handle:
                environment = dict(item.split(b"=", 1) for item in handle.read().split(b"\0") if b"=" in item)
        except (OSError, ValueError):
            continue
        if b"main.py" in command and b"HOROVOD_RANK" in environment and not any(b"exit_recorder" in c for c in command):
            found[int(environment[b"HOROVOD_RANK"])] = int(entry)
    return found


@pytest.mark.multirank
def test_a_step_stuck_in_a_collective_ends_within_the_stop_timeout(tmp_path):
    """Rank 1 frozen (SIGSTOP) leaves rank 0's step waiting in the gradient allreduce for ever; SIGTERM to
    rank 0 then ends it after --stop_timeout_s with one line and exit 143, and the last checkpoint stays intact."""
    data, save, codes = write_tiny(tmp_path / "data"), tmp_path / "save", tmp_path / "exit_codes"
    codes.mkdir()
    command = [HOROVODRUN, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, EXIT_RECORDER, str(codes),
               sys.executable, "main.py", f"--dataset_path={data}", *TINY_MODEL, *LONG_RUN,
               f"--save_checkpoint_path={save}", "--checkpoint_every_steps=5", "--stop_timeout_s=5"]
    process = subprocess.Popen(one_each(command), cwd=REPO, env=worker_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    lines, saved = [], threading.Event()
    reader = threading.Thread(target=lambda: [(lines.append(line), "saved checkpoint" in line and saved.set())
                                              for line in process.stdout], daemon=True)
    reader.start()
    ranks = {}
    try:
        assert saved.wait(240), "".join(lines)[-3000:]
        ranks = _rank_processes()
        assert sorted(ranks) == [0, 1], ranks
        os.kill(ranks[1], signal.SIGSTOP)
        time.sleep(2)  # rank 0 is now waiting for rank 1 in a step
        signalled = time.monotonic()
        os.kill(ranks[0], signal.SIGTERM)
        deadline = time.monotonic() + 60
        while not (codes / "rank0").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (codes / "rank0").read_text().strip() == "143", "".join(lines)[-3000:]
        assert time.monotonic() - signalled < 30
    finally:
        for pid in ranks.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait(timeout=120)
        reader.join(timeout=10)
    output = "".join(lines)
    match = re.search(r"error \(rank 0\): no training step ended within 5 s of SIGTERM \(the step is stuck in the input "
                      r"reader, or in a collective waiting for another rank; --stop_timeout_s\): stopped without saving; "
                      r"last checkpoint: (\S+)", output)
    assert match, output[-3000:]
    checkpoint_store.verify_files(match.group(1), checkpoint_store.read_manifest(match.group(1)))
    assert match.group(1) == checkpoint_store.latest_checkpoint(str(save))
