"""A flag given twice with different values is refused, naming it (absl would keep the last one silently);
the same value twice is accepted."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO, worker_env
from tf_dlrm.cli import flag_reference
from tf_dlrm.cli.flags import refuse_repeated_flags


@pytest.fixture(scope="module")
def values():
    return flag_reference.fresh_flag_values()


@pytest.mark.parametrize("argv, message", [
    (["--embedding_dim=8", "--epochs=1", "--embedding_dim=4"],
     "--embedding_dim is given twice with different values (--embedding_dim=8, then --embedding_dim=4); the last one "
     "would win without a word. Expected each flag once. Received: embedding_dim=8 and embedding_dim=4"),
    (["--batch_size", "256", "--batch_size=512"],
     "--batch_size is given twice with different values (--batch_size 256, then --batch_size=512); the last one would "
     "win without a word. Expected each flag once. Received: batch_size 256 and batch_size=512"),
    (["--resume", "--noresume"],
     "--resume is given twice with different values (--resume, then --noresume); the last one would win without a "
     "word. Expected each flag once. Received: resume and noresume"),
])
def test_different_values_are_refused(values, argv, message):
    with pytest.raises(ValueError) as raised:
        refuse_repeated_flags(["main.py", *argv], values)
    assert str(raised.value) == message


@pytest.mark.parametrize("argv", [
    ["--embedding_dim=8", "--embedding_dim", "8"],
    ["--resume", "--resume=true"],  # what a wrapper adding --resume to a command that has it gives
    ["--batch_size=256", "--", "--batch_size=512"],  # after --, arguments are not flags
])
def test_the_same_value_twice_is_accepted(values, argv):
    refuse_repeated_flags(["main.py", *argv], values)


def test_the_command_line_may_override_a_flagfile(values, tmp_path):
    flagfile = tmp_path / "flags.txt"
    flagfile.write_text("--embedding_dim=8\n")  # docs/training.md, A run in a file
    refuse_repeated_flags(["main.py", f"--flagfile={flagfile}", "--embedding_dim=4"], values)


@pytest.mark.slow
def test_main_refuses_before_any_work():
    completed = subprocess.run([sys.executable, "main.py", "--dataset_path=/nowhere", "--embedding_dim=8",
                                "--embedding_dim=4"], cwd=REPO, env=worker_env(), capture_output=True, text=True, timeout=300)
    assert completed.returncode == 2, completed.stderr[-3000:]
    assert completed.stderr.strip().splitlines()[-1] == (
        "error (rank 0): --embedding_dim is given twice with different values (--embedding_dim=8, then "
        "--embedding_dim=4); the last one would win without a word. Expected each flag once. Received: embedding_dim=8 "
        "and embedding_dim=4")
