"""The launcher's stop file (tf_dlrm/cli/launch.py): how ranks on other hosts learn of a signal.

The two-host test (tests/parallel/test_two_hosts.py) runs it for real; these check its parts: where
the file is, and that a rank acts on it once it exists, looking at most once a second."""

from __future__ import annotations

import os
import signal
import socket

from tf_dlrm.cli import launch
from tf_dlrm.train import interrupt


def test_the_stop_file_lies_in_the_checkpoint_directory_named_after_this_launcher(tmp_path):
    name = f".stop-{socket.gethostname()}-{os.getpid()}"
    save = str(tmp_path / "run")
    assert launch.stop_file_of(["-np", "2", "python", "main.py", f"--save_checkpoint_path={save}"]) == os.path.join(save, name)
    assert launch.stop_file_of(["python", "main.py", "--save_checkpoint_path", save]) == os.path.join(save, name)
    # Relative to the launcher's directory, where horovodrun starts every rank.
    assert launch.stop_file_of(["main.py", "--save_checkpoint_path=run"]) == os.path.join(os.getcwd(), "run", name)
    assert launch.stop_file_of(["main.py", "--dataset_path=data"]) is None  # no shared directory: signals only
    assert launch.stop_file_of(["main.py", "--save_checkpoint_path="]) is None


class _Env:
    distributed = False


def test_a_rank_stops_once_the_stop_file_exists(tmp_path, monkeypatch):
    stop_file = tmp_path / "run" / ".stop-host-1"
    monkeypatch.setenv(interrupt.STOP_FILE_ENV, str(stop_file))
    stop = interrupt.SignalStop()
    stop.training = True
    stop.poll(None, _Env(), 3)  # no file: training goes on
    assert launch.write_stop_file(str(stop_file)) and stop_file.exists()
    stop.poll(None, _Env(), 4)  # looked less than a second ago: not yet
    stop._next_look = 0.0  # a second later
    try:
        stop.poll(None, _Env(), 5)
    except interrupt.Interrupted as stopped:
        assert (stopped.step, stopped.exit_code) == (5, 128 + signal.SIGTERM)
    else:
        raise AssertionError("the stop file did not stop the run")


def test_without_the_variable_no_file_is_looked_for(tmp_path, monkeypatch):
    monkeypatch.delenv(interrupt.STOP_FILE_ENV, raising=False)
    stop = interrupt.SignalStop()
    assert stop.stop_file is None and not stop.stop_file_written()
