"""A stop signal while a program is still importing, before its own stop handlers are up, ends it at once with its one
line and ``128 + signal``. Before, SIGTERM killed it without a line, and a SIGINT to a tool started with SIGINT ignored
(a background command of a non-interactive shell) was lost: the tool ran to its end and exited 0
(benchmarks/results/preprocess_chaos.md, #36: SIGINT 0.37 s after the start).

Each program gets one signal as soon as it maps numpy's extension (``/proc/PID/maps``): the entry module's imports
are running then, well before the program's own handlers. The arguments are no valid run: a signal that got lost
shows as the program's own answer to them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, worker_env

TOOL_LINE = "{tool}: stopped by {signal} while starting; nothing was published (an earlier output is as it was)"
RANK_LINE = "interrupted by {signal} while starting; nothing was saved"
PROGRAMS = {
    "preprocessing.criteo": (["-m", "preprocessing.criteo", "--input=/nonexistent/day_0", "--output_dir={out}"], TOOL_LINE),
    "tf_dlrm.data.transcode": (["-m", "tf_dlrm.data.transcode", "--input_spec=/nonexistent/spec.yaml", "--output_dir={out}"], TOOL_LINE),
    "tf_dlrm.cli.apply_deltas": (["-m", "tf_dlrm.cli.apply_deltas", "--saved_model_path=/nonexistent", "--delta_dir=/nonexistent",
                                  "--output_path={out}"], TOOL_LINE),
    "tf_dlrm.data.synthetic": (["-m", "tf_dlrm.data.synthetic", "--feature_spec=/nonexistent/spec.yaml", "--output_dir={out}"], TOOL_LINE),
    "main.py": (["main.py", "--dataset_path=/nonexistent", "--save_checkpoint_path={out}"], RANK_LINE),
    # The console scripts (setup.cfg), called as pip's wrapper calls them.
    **{tool: (["-c", f"import sys; from {module} import {name}; sys.exit({name}())", *arguments], line)
       for tool, module, name, arguments, line in (
           ("tf-dlrm-train", "tf_dlrm.cli.console", "train", ["--dataset_path=/nonexistent", "--save_checkpoint_path={out}"], RANK_LINE),
           ("tf-dlrm-synthetic", "tf_dlrm.cli.console", "synthetic", ["--feature_spec=/nonexistent/spec.yaml", "--output_dir={out}"], TOOL_LINE),
           ("tf-dlrm-transcode", "tf_dlrm.cli.console", "transcode", ["--input_spec=/nonexistent/spec.yaml", "--output_dir={out}"], TOOL_LINE),
           ("tf-dlrm-apply-deltas", "tf_dlrm.cli.console", "apply_deltas", ["--saved_model_path=/nonexistent", "--delta_dir=/nonexistent", "--output_path={out}"], TOOL_LINE),
           ("tf-dlrm-preprocess-criteo", "preprocessing.console_script", "criteo", ["--input=/nonexistent/day_0", "--output_dir={out}"], TOOL_LINE))},
    # Its horovodrun is /bin/false here: a lost signal shows as the launcher's exit 1.
    "tf_dlrm launch": (["-m", "tf_dlrm.cli.launch", "-np", "1", "-H", "localhost:1", "python", "main.py",
                        "--save_checkpoint_path={out}"], "{tool}: stopped by {signal} while starting; no job was started"),
}
# A late signal (the imports ended before it came) meets the program's own handler, which says this.
OWN_HANDLERS = ("nothing was published (an earlier output is as it was)", "before training started",
                "while starting the job")


def _ignoring_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _importing_numpy(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as handle:
            return "_multiarray_umath" in handle.read()
    except OSError:
        return False


def _signalled_while_importing(arguments: list[str], number: int, output_dir: str) -> tuple[int, str]:
    argv = [sys.executable, *(argument.format(out=output_dir) for argument in arguments)]
    process = subprocess.Popen(argv, cwd=REPO, env=worker_env({"HOROVODRUN": "/bin/false"}),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=_ignoring_sigint if number == signal.SIGINT else None)
    try:
        deadline = time.monotonic() + 60
        while not _importing_numpy(process.pid) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        process.send_signal(number)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, stderr


# SIGINT as a background command of a non-interactive shell starts (ignored: the lost case), SIGTERM at its default.
@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("program", list(PROGRAMS))
def test_a_signal_during_the_imports_ends_the_program_with_its_line(tmp_path, program, number):
    arguments, line = PROGRAMS[program]
    for attempt in range(3):  # a loaded machine may hold this test back until the imports have ended: again
        code, stderr = _signalled_while_importing(arguments, number, str(tmp_path / f"out{attempt}"))
        if not any(own in stderr for own in OWN_HANDLERS):
            break
    lines = [text for text in stderr.splitlines() if text.strip()]
    assert code == 128 + number, stderr[-3000:]
    assert lines and lines[-1] == line.format(tool=program, signal=signal.Signals(number).name), stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert not os.path.exists(tmp_path / f"out{attempt}")
