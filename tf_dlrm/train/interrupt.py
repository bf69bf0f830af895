"""SIGINT and SIGTERM end a run cleanly: agreed step, a checkpoint, one line, exit 130 or 143.

Ctrl-C in a terminal sends SIGINT to one process; horovodrun, when it is interrupted or killed,
sends SIGTERM to every rank and SIGKILLs them 5 s later. Either way:

1. Before training starts, a signal ends the process at once (nothing to save yet).
2. During training the handler only records the signal. Several ranks must stop after the *same*
   step (a checkpoint save is collective): each rank's request rides on the step's gradient
   allreduce (``Trainer.stop_request`` / ``stop_agreed``), so all ranks learn of it after the same
   step without an extra collective. One process needs no agreement.
3. The loop raises :class:`Interrupted`; ``main`` saves a checkpoint when
   ``--save_checkpoint_path`` is set and that step is not saved already, prints
   ``interrupted at step N; last checkpoint: PATH`` (rank 0) and exits with ``128 + signal``.
   A signal that arrives during a save only marks the run to stop after the save.
4. A watchdog bounds the wait for that step: a step stuck in the input reader or in a collective
   (another rank stopped or hung) never returns to Python, so neither the handler nor the loop runs.
   The signal also wakes a thread (``signal.set_wakeup_fd``: written by the C-level handler, whatever
   the main thread is doing); when no step ends within ``stuck_after_s`` of the signal (evaluations and
   saves in progress do not count), it prints one line and ends the process with ``128 + signal``.
   Nothing is saved then; the last checkpoint, published atomically, is intact.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
import time
from typing import Callable

from tf_dlrm.io import files

SIGNALS = (signal.SIGINT, signal.SIGTERM)
# Set by tf_dlrm.cli.launch for the ranks it starts: it gives them the time a save needs.
LAUNCHER_ENV = "TF_DLRM_LAUNCHER"
# Set by tf_dlrm.cli.launch too: a file in the checkpoint directory (shared by every host) that the
# launcher writes when it is signalled. Ranks on other hosts get no signal from it (horovodrun's SIGTERM
# ends only its local ssh clients), so every rank looks for the file, at most once a second.
STOP_FILE_ENV = "TF_DLRM_STOP_FILE"
STOP_FILE_EVERY_S = 1.0
HOROVODRUN_WARNING = (
    "signal received: every rank stops after the same step and saves a checkpoint; horovodrun kills the ranks "
    "5 s after it passes a signal on, which the save of a large model may not survive (then the last periodic "
    "checkpoint stands). Launch with `python -m tf_dlrm.cli.launch` instead of horovodrun to give the save its "
    "time (docs/training.md, Preemption)\n")


class Interrupted(Exception):
    """Training stopped at ``step`` because of ``signal_number`` (on this rank or another)."""

    def __init__(self, step: int, signal_number: int):
        super().__init__(f"interrupted at step {step}")
        self.step, self.signal_number = step, signal_number

    @property
    def exit_code(self) -> int:
        return 128 + self.signal_number


DEFAULT_STUCK_AFTER_S = 60.0


class SignalStop:
    """Handles SIGINT and SIGTERM for the whole run; install once, at the start of ``main``.

    Attributes:
        stuck_after_s: after a signal during training, how long a step may take to end before the
            watchdog ends the process (``--stop_timeout_s``).
        last_checkpoint: returns the newest checkpoint's path (or None), for the watchdog's line.
    """

    def __init__(self, stuck_after_s: float = DEFAULT_STUCK_AFTER_S):
        self.received: int | None = None
        self.training = False
        self.stuck_after_s = stuck_after_s
        self.last_checkpoint: Callable[[], str | None] = lambda: None
        self._previous = {}
        self.stop_file = os.environ.get(STOP_FILE_ENV) or None
        self._next_look = 0.0
        self._watching = False  # steps are running: the watchdog may act
        self._paused = 0  # inside an evaluation or a save, which the watchdog does not time
        self._last_beat = time.monotonic()
        self._wakeup: tuple[int, int] | None = None
        self._previous_wakeup = -1

    def install(self) -> "SignalStop":
        for number in SIGNALS:
            self._previous[number] = signal.signal(number, self._handle)
        if self._wakeup is None:
            read_end, write_end = os.pipe()
            os.set_blocking(write_end, False)
            self._wakeup = (read_end, write_end)
            self._previous_wakeup = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
            threading.Thread(target=self._watch, args=(read_end,), name="stuck-step-watchdog", daemon=True).start()
        return self

    def uninstall(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()
        if self._wakeup is not None:
            signal.set_wakeup_fd(self._previous_wakeup)
            os.close(self._wakeup[1])  # the watchdog thread reads end-of-file and ends
            self._wakeup = None

    # ------------------------------------------------------------------ the watchdog

    def watch_steps(self, watching: bool) -> None:
        """Marks the span in which training steps run (the watchdog acts only inside it)."""
        self._last_beat = time.monotonic()
        self._watching = watching

    @contextlib.contextmanager
    def paused(self):
        """An evaluation or a save: as long as it takes, it is no stuck step."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1
            self._last_beat = time.monotonic()

    def _watch(self, read_end: int) -> None:
        """The watchdog thread: wakes on a signal (see the module docstring, 4)."""
        while True:
            try:
                data = os.read(read_end, 64)
            except OSError:
                return
            if not data:
                return
            numbers = [number for number in data if number in SIGNALS]
            if numbers and self._watching:
                self._time_the_step(numbers[0], time.monotonic())

    def _time_the_step(self, number: int, signalled_at: float) -> None:
        while self._watching:
            since = max(self._last_beat, signalled_at)
            if not self._paused and time.monotonic() - since > self.stuck_after_s:
                self._end_stuck(number)
            time.sleep(min(1.0, self.stuck_after_s / 10))

    def _end_stuck(self, number: int) -> None:
        try:
            last = self.last_checkpoint()
        except Exception:  # noqa: BLE001: the line must come out whatever the storage does
            last = None
        rank = os.environ.get("HOROVOD_RANK", "0")
        line = (f"error (rank {rank}): no training step ended within {self.stuck_after_s:g} s of "
                f"{signal.Signals(number).name} (the step is stuck in the input reader, or in a collective waiting "
                f"for another rank; --stop_timeout_s): stopped without saving; last checkpoint: {last or 'none'}\n")
        with contextlib.suppress(OSError):
            os.write(2, line.encode())
        os._exit(128 + number)

    def _handle(self, number, frame) -> None:
        del frame
        first = self.received is None
        self.received = self.received or number
        if not self.training and first:
            # Nothing to save yet: leave now, quietly (a traceback would tell the user nothing).
            raise Interrupted(0, number)
        if first and os.environ.get("HOROVOD_RANK") == "0" and not os.environ.get(LAUNCHER_ENV):
            # Under plain horovodrun the save may be cut short: say so now, while there is time.
            os.write(2, HOROVODRUN_WARNING.encode())

    def stop_file_written(self) -> bool:
        """Whether the launcher has written :data:`STOP_FILE_ENV`'s file (looked for at most once a second:
        on shared or remote storage a look is a round trip)."""
        if self.stop_file is None or time.monotonic() < self._next_look:
            return False
        self._next_look = time.monotonic() + STOP_FILE_EVERY_S
        return files.exists(self.stop_file)

    def poll(self, trainer, env, step: int) -> None:
        """After each step: raises Interrupted when this rank, or (several ranks) any rank, was signalled
        (or found the launcher's stop file)."""
        self._last_beat = time.monotonic()
        if self.received is None and self.stop_file_written():
            self.received = signal.SIGTERM
        if not env.distributed:
            if self.received is not None:
                raise Interrupted(step, self.received)
            return
        if self.received is not None and float(trainer.stop_request.numpy()) == 0.0:
            trainer.stop_request.assign(1.0)  # voted in the next step's allreduce
        if float(trainer.stop_agreed.numpy()) > 0.0:
            raise Interrupted(step, self.received or signal.SIGTERM)


def report(interrupted: Interrupted, checkpoint: str | None, is_chief: bool) -> None:
    """The one line a stopped run ends with (rank 0), on stderr."""
    if is_chief:
        print(f"interrupted at step {interrupted.step}; last checkpoint: {checkpoint or 'none'}", file=sys.stderr, flush=True)


def exit_now(code: int) -> None:
    """Leaves at once, without unwinding, after flushing stdout and stderr.

    - A failed run may still hold a tf.data iterator with reads in flight. Freeing it (when the
      exception's traceback is freed, during ``sys.exit``) joins the parallel-map threads while holding
      the GIL, and a reader thread inside its ``numpy_function`` waits for the GIL: the process hung
      after printing its error (gdb: the main thread in ``ParallelMapDatasetOp::Dataset::Iterator::~Iterator``).
    - Ranks that pass a last barrier together also exit together: the interpreter's teardown
      (TensorFlow's, Horovod's) takes a varying while, and horovodrun kills the ranks still running
      when one exits non-zero.
    Everything a run reports is flushed line by line (``Reporter``), so nothing is lost.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def lost_rank_message(error: BaseException) -> str | None:
    """One readable line for a collective that failed because another rank died, else None.

    Horovod over Gloo raises a TensorFlow error whose text ends in the Gloo transport's complaint
    (``[.../gloo/transport/tcp/pair.cc:589] Read error [127.0.0.1]:55954: Connection reset by peer``);
    the Python traceback around it tells the user nothing more.
    """
    text = str(error)
    if "gloo" not in text.lower() and "horovod" not in text.lower():
        return None
    lines = [line.strip() for line in text.splitlines() if "gloo" in line.lower() or "horovod" in line.lower()]
    cause = (re.sub(r"^\[[^\]]*\]\s*", "", lines[-1]) if lines else text.splitlines()[0]).rstrip(".")
    return (
        f"a collective failed: {cause}. Another rank has probably died (horovodrun names it); continue from "
        "the last checkpoint with --resume, or run under scripts/train_resilient.sh"
    )
