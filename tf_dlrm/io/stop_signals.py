"""SIGINT and SIGTERM end a long-running tool (preprocessing, transcode, synthetic data, id counts)
cleanly: the signal becomes an exception in the main thread, so every ``finally`` runs (worker pools
are ended, the unpublished temporary output is removed: :func:`tf_dlrm.io.publish.staged_output`),
one line says what happened, and the exit status is ``128 + signal``. An earlier output stays as it was.
A second signal ends the process at once (the clean-up the first one started may be what is stuck),
still removing the temporary output.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from tf_dlrm.io import publish

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(SystemExit):
    """The tool was asked to stop by ``signal_number``."""

    def __init__(self, signal_number: int):
        super().__init__(128 + signal_number)
        self.signal_number = signal_number


def _raise(number, frame) -> None:
    del frame
    for each in SIGNALS:  # a second signal must not raise inside the clean-up the first one started
        signal.signal(each, _end_now)
    raise Stopped(number)


def _end_now(number, frame) -> None:
    """A second signal: the clean-up the first one started may be stuck, so end the process now,
    removing the temporary outputs (the workers end with their parent)."""
    del frame
    with contextlib.suppress(BaseException):
        publish.remove_staged()
    with contextlib.suppress(BaseException):
        sys.stderr.write(f"stopped at once by a second {signal.Signals(number).name}; "
                         "the temporary output was removed, nothing was published\n")
        sys.stderr.flush()
    os._exit(128 + number)


@contextlib.contextmanager
def stopping_cleanly(tool: str):
    """Wrap a tool's ``main``: a signal stops it with its temporary output removed and one line."""
    previous = {number: signal.signal(number, _raise) for number in SIGNALS}
    try:
        yield
    except Stopped as stopped:
        print(f"{tool}: stopped by {signal.Signals(stopped.signal_number).name}; nothing was published "
              "(an earlier output is as it was)", file=sys.stderr, flush=True)
        # Every ``finally`` has run. Exit now rather than at the interpreter's end, which joins the
        # threads a worker pool left (a pool's manager thread can block for ever on a pipe that only
        # its ended workers read).
        sys.stdout.flush()
        os._exit(stopped.code)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
