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
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time

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


class SignalStop:
    """Handles SIGINT and SIGTERM for the whole run; install once, at the start of ``main``."""

    def __init__(self):
        self.received: int | None = None
        self.training = False
        self._previous = {}
        self.stop_file = os.environ.get(STOP_FILE_ENV) or None
        self._next_look = 0.0

    def install(self) -> "SignalStop":
        for number in SIGNALS:
            self._previous[number] = signal.signal(number, self._handle)
        return self

    def uninstall(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

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
