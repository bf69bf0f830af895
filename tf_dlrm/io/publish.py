"""Every writer of a directory (preprocessing.criteo, transcode, synthetic, export) goes through here.

The rules, so that no run ever loses a user's file:

1. The output is written into a fresh temporary sibling ``.<name>.tmp-XXXX`` and published with a
   rename once complete: an interrupted or failed run leaves the earlier output as it was. The
   temporary output names its writer (host, pid); the next run removes those whose writer died
   without cleaning up (SIGKILL).
2. A manifest (``.tf_dlrm_output.json``) lists every file the writer put there. An existing
   ``output_dir`` is replaced only when it is empty, or holds nothing but the files its manifest
   lists and was written by the same tool; anything else (a user's notes, a checkpoint, files of
   another tool) makes the writer refuse, naming the first foreign file.
3. An input the writer reads (a raw log, a csv spec and its files, a vocabulary, a checkpoint) must
   not lie inside ``output_dir``: replacing the directory would delete it. Transcoding in place is
   refused by this rule.

Checkpoints follow the same idea in :mod:`tf_dlrm.checkpoint.store` (hidden temporary
directory, rename, retention that only touches ``ckpt-<step>`` directories).

Remote outputs (``gs://``, ``s3://``, ``ram://``: :mod:`tf_dlrm.io.files`) cannot be swapped in by a
rename (no filesystem of TensorFlow renames a directory atomically): there the output is written in
place and its manifest, written last, says it is complete; an earlier output is removed (manifest
first) before the new one is written, and a failed write removes what it wrote.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import tempfile
from typing import Iterable, Iterator

from tf_dlrm.io import files

MANIFEST = ".tf_dlrm_output.json"
OWNER = ".tf_dlrm_writer.json"  # in a temporary output only: who writes it (host, pid)


# The temporary outputs this process is writing now: a second stop signal ends the process at once
# (tf_dlrm.io.stop_signals), without unwinding, and removes these on its way out.
_STAGED: set[str] = set()


# Outputs this process has published (a stop signal after that must not say that nothing was).
PUBLISHED: list[str] = []
# Stop signals that came while an output was being swapped in (see ``_swap_held``), raised again after it.
_HELD: list[int] = []
_holding = False


def remove_staged() -> None:
    """Removes the temporary outputs this process is writing (see ``_STAGED``)."""
    for workspace in list(_STAGED):
        shutil.rmtree(workspace, ignore_errors=True)


def hold_signal(number: int) -> bool:
    """Called by the stop-signal handler (:mod:`tf_dlrm.io.stop_signals`): True when the signal must wait because an
    output is being swapped in (it is raised again once the swap is done)."""
    if _holding:
        _HELD.append(number)
    return _holding


@contextlib.contextmanager
def _swap_held() -> Iterator[None]:
    """The renames that swap an output in: a stop signal between them would leave ``output_dir`` missing and the
    earlier output under a hidden name, so it waits until they are done (two renames: no wait to speak of)."""
    global _holding
    _holding = True
    try:
        yield
    finally:
        _holding = False
        if _HELD:
            signal.raise_signal(_HELD.pop(0))


class OutputDirectoryError(FileExistsError, ValueError):
    """An output directory cannot be (re)written without losing something that is not ours."""


def _files(directory: str) -> list[str]:
    """Every file and link under ``directory``, relative, sorted (empty directories are not listed)."""
    if files.is_remote(directory):
        return files.walk_files(directory)
    found = []
    for root, directories, names in os.walk(directory):
        found += [os.path.relpath(os.path.join(root, n), directory) for n in names]
        # A link to a directory is an entry of its own: never walk into it, never delete through it.
        found += [os.path.relpath(os.path.join(root, d), directory) for d in directories if os.path.islink(os.path.join(root, d))]
    return sorted(found)


def check_replaceable(output_dir: str, flag: str, writer: str, inputs: Iterable[str] = ()) -> None:
    """Raises OutputDirectoryError unless ``writer`` may replace ``output_dir`` (rules 2 and 3 above).

    Args:
        output_dir: the directory to be written.
        flag: how the user named it (``--output_dir``), for the message.
        writer: the tool's name, recorded in and compared with the manifest.
        inputs: paths the writer reads.
    """
    for path in inputs:
        if path and files.inside(path, output_dir):
            raise OutputDirectoryError(
                f"{flag}={output_dir} holds {path}, an input of this run: writing the output there would delete "
                "its own input. Choose an output directory outside the input's"
            )
    if not files.exists(output_dir):
        return
    if not files.isdir(output_dir) or (not files.is_remote(output_dir) and os.path.islink(output_dir)):
        raise OutputDirectoryError(f"{flag}={output_dir} exists and is not a directory: refusing to replace it")
    present = _files(output_dir)
    if not present:
        return
    try:
        with files.open_file(files.join(output_dir, MANIFEST), "r", encoding="utf-8") as handle:
            manifest = json.load(handle)
        listed, owner = set(manifest["files"]), manifest["writer"]
    except (OSError, ValueError, KeyError, TypeError):
        raise OutputDirectoryError(
            f"{flag}={output_dir} is not empty and was not written by {writer} (no readable {MANIFEST}); "
            f"refusing to replace it, it holds e.g. {present[0]}. Choose a new or empty directory"
        ) from None
    if owner != writer:
        raise OutputDirectoryError(f"{flag}={output_dir} was written by {owner}, not {writer}: refusing to replace it")
    foreign = [name for name in present if name != MANIFEST and name not in listed]
    if foreign:
        raise OutputDirectoryError(
            f"{flag}={output_dir} holds {len(foreign)} file(s) that {writer} did not write, e.g. {foreign[0]}: "
            "refusing to replace it. Move them away or choose another directory"
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def remove_abandoned(parent: str, name: str) -> list[str]:
    """Removes the temporary outputs ``.<name>.tmp-*`` in ``parent`` that a writer on this host left
    when it was killed (SIGKILL, a crash: no ``finally`` ran); a live writer's are kept. Returns them."""
    removed = []
    for entry in os.listdir(parent):
        if not entry.startswith(f".{name}.tmp-"):
            continue
        path = os.path.join(parent, entry)
        try:
            with open(os.path.join(path, OWNER), encoding="utf-8") as handle:
                owner = json.load(handle)
        except (OSError, ValueError):
            continue  # not ours, or its writer is between creating it and naming itself
        if owner.get("host") == socket.gethostname() and not _alive(int(owner.get("pid", 0))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _publish(workspace: str, output_dir: str) -> None:
    """Swaps the finished workspace in; an earlier output is removed only after the swap.

    The earlier output, renamed aside, is removed even when a stop signal cuts its removal short (again while the
    signal unwinds, and by the second signal's end through ``_STAGED``): no ``.<name>.old-*`` is left behind.
    """
    if not os.path.lexists(output_dir):
        with _swap_held():
            os.rename(workspace, output_dir)
            PUBLISHED.append(output_dir)
        return
    parent, name = os.path.split(os.path.abspath(output_dir))
    old = tempfile.mkdtemp(prefix=f".{name}.old-", dir=parent)
    os.rmdir(old)
    try:
        with _swap_held():
            os.rename(output_dir, old)
            try:
                os.rename(workspace, output_dir)
            except BaseException:
                os.rename(old, output_dir)
                raise
            PUBLISHED.append(output_dir)
            _STAGED.add(old)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        if old in _STAGED:
            shutil.rmtree(old, ignore_errors=True)
            _STAGED.discard(old)


@contextlib.contextmanager
def staged_output(output_dir: str, flag: str, writer: str, inputs: Iterable[str] = ()) -> Iterator[str]:
    """Yields a fresh temporary sibling of ``output_dir`` to write into; publishes it on success.

    Checks ``output_dir`` before (so a run refuses before any work) and again just before the
    rename (a user may have put a file there meanwhile). On an exception nothing is published and
    the temporary directory is removed.
    """
    inputs = [files.absolute(p) for p in inputs if p]
    output_dir = files.absolute(output_dir)
    check_replaceable(output_dir, flag, writer, inputs)
    if files.is_remote(output_dir):
        with _written_in_place(output_dir, writer) as workspace:
            yield workspace
        return
    parent, name = os.path.split(output_dir)
    os.makedirs(parent, exist_ok=True)
    remove_abandoned(parent, name)
    workspace = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
    _STAGED.add(workspace)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(workspace, 0o777 & ~umask)  # mkdtemp makes it private; the output is not
    owner = os.path.join(workspace, OWNER)
    with open(owner, "w", encoding="utf-8") as handle:
        json.dump({"host": socket.gethostname(), "pid": os.getpid()}, handle)
    try:
        yield workspace
        os.remove(owner)
        with open(os.path.join(workspace, MANIFEST), "w", encoding="utf-8") as handle:
            json.dump({"writer": writer, "files": _files(workspace)}, handle, indent=1)
        check_replaceable(output_dir, flag, writer, inputs)
        _publish(workspace, output_dir)
    finally:
        if os.path.exists(workspace):
            shutil.rmtree(workspace, ignore_errors=True)
        _STAGED.discard(workspace)


@contextlib.contextmanager
def _written_in_place(output_dir: str, writer: str) -> Iterator[str]:
    """A remote output (see the module docstring): the earlier one removed, manifest first; the new one
    written in place, its manifest last; on an exception what was written is removed."""
    if files.exists(output_dir):
        if files.isfile(files.join(output_dir, MANIFEST)):
            files.remove(files.join(output_dir, MANIFEST))
        files.rmtree(output_dir)
    files.makedirs(output_dir)
    try:
        yield output_dir
        with files.open_file(files.join(output_dir, MANIFEST + ".partial"), "w", encoding="utf-8") as handle:
            json.dump({"writer": writer, "files": [n for n in _files(output_dir) if n != MANIFEST + ".partial"]},
                      handle, indent=1)
        files.rename(files.join(output_dir, MANIFEST + ".partial"), files.join(output_dir, MANIFEST), overwrite=True)
    except BaseException:
        files.rmtree(output_dir)
        raise
