"""SIGINT and SIGTERM end a long-running tool (preprocessing, transcode, synthetic data, id counts)
cleanly: the signal becomes an exception in the main thread, so every ``finally`` runs (worker pools
are ended, the unpublished temporary output is removed: :func:`tf_dlrm.io.publish.staged_output`),
one line says what happened, and the exit status is ``128 + signal``. An earlier output stays as it was.
"""

from __future__ import annotations

import contextlib
import signal
import sys

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(SystemExit):
    """The tool was asked to stop by ``signal_number``."""

    def __init__(self, signal_number: int):
        super().__init__(128 + signal_number)
        self.signal_number = signal_number


def _raise(number, frame) -> None:
    del frame
    for each in SIGNALS:  # a second signal must not interrupt the clean-up
        signal.signal(each, signal.SIG_IGN)
    raise Stopped(number)


@contextlib.contextmanager
def stopping_cleanly(tool: str):
    """Wrap a tool's ``main``: a signal stops it with its temporary output removed and one line."""
    previous = {number: signal.signal(number, _raise) for number in SIGNALS}
    try:
        yield
    except Stopped as stopped:
        print(f"{tool}: stopped by {signal.Signals(stopped.signal_number).name}; nothing was published "
              "(an earlier output is as it was)", file=sys.stderr, flush=True)
        raise
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
