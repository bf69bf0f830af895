"""SIGINT and SIGTERM end a long-running tool (preprocessing, transcode, synthetic data, id counts)
cleanly: the signal becomes an exception in the main thread, so every ``finally`` runs (worker pools
are ended, the unpublished temporary output is removed: :func:`tf_dlrm.io.publish.staged_output`),
one line says what happened, and the exit status is ``128 + signal``. An earlier output stays as it was.
A second signal ends the process at once (the clean-up the first one started may be what is stuck),
still removing the temporary output. Both ways end with ``os._exit``, which skips ``atexit``: a scratch directory
the process keeps until its end (:func:`remove_when_ending`) is removed on those ways too, and every process the
tool started that is still running (a Spark JVM caught starting, its Python workers) is killed, so that nothing
of the tool outlives it.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import sys

from tf_dlrm.io import publish

SIGNALS = (signal.SIGINT, signal.SIGTERM)

# Directories this process needs until it ends (code shipped to Spark executors), never an output.
_SCRATCH: set[str] = set()


def remove_when_ending(directory: str) -> None:
    """Removes ``directory`` when this process ends: at the interpreter's exit, and also when a stop signal ends it
    through ``os._exit`` (see the module's docstring)."""
    _SCRATCH.add(directory)


def descendants(pid: int | None = None) -> list[int]:
    """The live descendants of process ``pid`` (this process by default), children first; empty without ``/proc``.

    Collect them before ending any: a process whose parent died is adopted by another and leaves the tree.
    """
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, queue = [], [os.getpid() if pid is None else pid]
    while queue:
        for child in children.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def kill_all(pids) -> None:
    """SIGKILL to each of ``pids`` that still exists."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _adopt_orphans() -> None:
    """Makes this process the one that adopts its descendants' orphans (Linux: PR_SET_CHILD_SUBREAPER), so a worker
    whose parent died first (a Spark Python worker whose JVM was killed) stays among :func:`descendants` and is
    ended with the tool, instead of finishing its task under init."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def _end_of_process() -> None:
    """What every way out of a stopped tool does last: its scratch removed, its remaining processes killed."""
    for _ in range(3):  # a process killed may leave orphans, adopted by this one: end those too
        with contextlib.suppress(BaseException):
            left = descendants()
            if not left:
                break
            kill_all(left)
    with contextlib.suppress(BaseException):
        _remove_scratch()


@atexit.register
def _remove_scratch() -> None:
    for directory in list(_SCRATCH):
        shutil.rmtree(directory, ignore_errors=True)
        _SCRATCH.discard(directory)


class Stopped(SystemExit):
    """The tool was asked to stop by ``signal_number``."""

    def __init__(self, signal_number: int):
        super().__init__(128 + signal_number)
        self.signal_number = signal_number


# The stop signals received: Python runs a handler wherever the main thread is, inside a finalizer (``__del__``, a
# weakref callback) too, where the exception it raises is printed ("Exception ignored in ...") and dropped.
_RECEIVED: list[int] = []


# Called by the first stop signal's handler before it raises (see on_stop).
_ON_STOP: list = []


def on_stop(callback) -> None:
    """Runs ``callback()`` (quick, and safe inside a signal handler) when the first stop signal comes, before its
    exception unwinds: a Spark engine kills its JVM there, so that no call made while unwinding (pyspark's own, in a
    ``with`` exit) waits on the gateway connection the signal cut in the middle of a call."""
    _ON_STOP.append(callback)


def check() -> None:
    """Raises :class:`Stopped` again when a stop signal came but its exception was dropped (see ``_RECEIVED``): long
    loops call it between pieces of work, and a tool that runs to its end is still reported as stopped."""
    if _RECEIVED:
        raise Stopped(_RECEIVED[0])


def _raise(number, frame) -> None:
    del frame
    if publish.hold_signal(number):  # an output is being swapped in: raised again right after
        return
    _RECEIVED.append(number)
    for callback in _ON_STOP:
        with contextlib.suppress(Exception):
            callback()
    for each in SIGNALS:  # a second signal must not raise inside the clean-up the first one started
        signal.signal(each, _end_now)
    raise Stopped(number)


def _end_now(number, frame) -> None:
    """A second signal: the clean-up the first one started may be stuck, so end the process now,
    removing the temporary outputs (the workers end with their parent)."""
    del frame
    with contextlib.suppress(BaseException):
        publish.remove_staged()
    _end_of_process()
    with contextlib.suppress(BaseException):
        sys.stderr.write(f"stopped at once by a second {signal.Signals(number).name}; "
                         "the temporary output was removed, nothing was published\n")
        sys.stderr.flush()
    os._exit(128 + number)


@contextlib.contextmanager
def stopping_cleanly(tool: str):
    """Wrap a tool's ``main``: a signal stops it with its temporary output removed and one line."""
    previous = {number: signal.signal(number, _raise) for number in SIGNALS}
    _adopt_orphans()
    try:
        yield
        check()
    except BaseException as error:
        if not isinstance(error, Stopped):
            if not _RECEIVED:
                raise
            # Raised while the stop unwound (a call on a connection the stop cut), or the tool's own exit after a
            # stop whose exception was dropped (absl's app.run ends with SystemExit): the stop is what happened.
            error = Stopped(_RECEIVED[0])
        stopped = error
        name = signal.Signals(stopped.signal_number).name
        if publish.PUBLISHED:  # the signal came after the output was complete and in place
            published = ", ".join(dict.fromkeys(publish.PUBLISHED))
            print(f"{tool}: stopped by {name} after its output was published: {published}", file=sys.stderr, flush=True)
        else:
            print(f"{tool}: stopped by {name}; nothing was published (an earlier output is as it was)",
                  file=sys.stderr, flush=True)
        # Every ``finally`` has run. Exit now rather than at the interpreter's end, which joins the
        # threads a worker pool left (a pool's manager thread can block for ever on a pipe that only
        # its ended workers read).
        sys.stdout.flush()
        _end_of_process()
        os._exit(stopped.code)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
