"""A stop signal that comes while a program is still starting ends it at once, with its one line and ``128 + signal``.

A tool's own stop handlers (:func:`tf_dlrm.io.stop_signals.stopping_cleanly`, ``main.py``'s
:class:`tf_dlrm.train.interrupt.SignalStop`) are installed when its work begins, after its imports (numpy, pyarrow,
TensorFlow: seconds on a loaded machine). A signal before that was not one the tool answered: SIGTERM killed it
without a line, SIGINT raised ``KeyboardInterrupt`` inside some import (a traceback), and a SIGINT to a process
started with SIGINT ignored (a background command of a non-interactive shell, ``tool ... &`` in a script) was lost:
the tool ran to its end and exited 0.

An entry module calls :func:`stop_while_starting` as its first statement, before its other imports, and only when it
runs as the program (``if __name__ == "__main__"``): a module imported as a library leaves the signals alone. Nothing
has been started or written yet then, so the process can end at once; the tool's own handlers replace these when its
work begins. This module imports nothing but ``os``, ``signal`` and ``sys`` (already loaded by the interpreter), so
the window left is the interpreter's own start.
"""

from __future__ import annotations

import os
import signal
import sys

SIGNALS = (signal.SIGINT, signal.SIGTERM)


TOOL_LINE = "{tool}: stopped by {signal} while starting; nothing was published (an earlier output is as it was)"


def stop_while_starting(tool: str, line: str | None = TOOL_LINE) -> None:
    """Until the program's own handlers replace them, SIGINT and SIGTERM end the process at once with status
    ``128 + signal``, after writing ``line`` to stderr (``{tool}`` and ``{signal}`` filled in; None: no line).
    Installed also over a signal that was ignored when the process started, as the tool's own handlers are."""

    def stop(number: int, frame) -> None:
        del frame
        name = signal.Signals(number).name
        text = None if line is None else line.format(tool=tool, signal=name)
        publish = sys.modules.get("tf_dlrm.io.publish")
        if text is not None and publish is not None and publish.PUBLISHED:
            # Back in place after the tool's own handlers: the work is done and its output complete.
            text = f"{tool}: stopped by {name} after its output was published: " + ", ".join(dict.fromkeys(publish.PUBLISHED))
        if text is not None:
            try:
                os.write(2, (text + "\n").encode())
            except OSError:
                pass
        os._exit(128 + number)

    for number in SIGNALS:
        signal.signal(number, stop)


RANK_LINE = "interrupted by {signal} while starting; nothing was saved"


def stop_rank_while_starting(tool: str = "main.py") -> None:
    """``main.py``'s :func:`stop_while_starting`: rank 0 (``HOROVOD_RANK``; a single process) writes
    :data:`RANK_LINE` (as ``main.py``'s own handler writes ``interrupted before training started``), other ranks
    nothing."""
    stop_while_starting(tool, RANK_LINE if os.environ.get("HOROVOD_RANK", "0") == "0" else None)
