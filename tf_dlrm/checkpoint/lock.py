"""Who writes a checkpoint directory, and what retention may delete while someone reads it.

- **One writer.** A training run that saves under ``DIR`` holds an exclusive ``flock`` on
  ``DIR/.lock`` from its start to its exit. The kernel releases it on any exit (SIGKILL included),
  so a lock is never stale; the file's text only names the holder (host, pid, start, command) for
  the message that refuses a second run.
- **Readers keep what they read.** ``--resume``, ``--restore_checkpoint_path``, ``--mode=eval`` and
  export hold a shared ``flock`` on the ``manifest.json`` of the checkpoint they restore until every
  rank has read it; retention (:func:`tf_dlrm.checkpoint.store.retain`) deletes a checkpoint only when
  it can take that lock exclusively (:func:`tf_dlrm.checkpoint.store.exclusive_if_unread`), and otherwise
  keeps it for the next save's retention.

``flock`` works on local filesystems and on NFS (Linux maps it to NFS byte-range locks). Object
stores (``gs://``, ``s3://``, any remote path of :mod:`tf_dlrm.io.files`) have no locks: there a run
takes none (:class:`Unlocked`, saying so in one line), and a reader holds nothing against retention,
so one run per remote directory is the user's to ensure.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time

from tf_dlrm.checkpoint.store import MANIFEST, CheckpointError
from tf_dlrm.io import files

LOCK_FILE = ".lock"


class CheckpointVanished(CheckpointError):
    """The checkpoint was deleted (by its run's retention) between being chosen and being locked."""


class DirectoryLock:
    """The exclusive lock of a run on its ``--save_checkpoint_path`` (released by :meth:`release` or exit)."""

    note = None  # what to tell the user about the lock: nothing, it is held

    def __init__(self, directory: str):
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, LOCK_FILE)
        self._descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder()
            os.close(self._descriptor)
            raise CheckpointError(
                f"--save_checkpoint_path={directory} is in use by another training run ({holder}); two runs saving "
                "into one directory would delete each other's checkpoints: give this run its own directory, or "
                "stop the other one") from None
        record = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                  "command": " ".join(sys.argv)}
        os.ftruncate(self._descriptor, 0)
        os.pwrite(self._descriptor, (json.dumps(record) + "\n").encode("utf-8"), 0)

    def _holder(self) -> str:
        try:
            record = json.loads(os.pread(self._descriptor, 1 << 16, 0).decode("utf-8"))
            return f"pid {record['pid']} on host {record['host']} since {record['started']}: {record['command']}"
        except (OSError, ValueError, KeyError):
            return "its lock file names no holder yet"

    def release(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)  # closing drops the flock
            self._descriptor = None


class Unlocked:
    """A remote ``--save_checkpoint_path``: object stores have no file locks, so nothing is held."""

    def __init__(self, directory: str):
        self.note = (f"note: --save_checkpoint_path={directory} is on remote storage, which has no file locks: this "
                     "run does not lock it, so make sure no other run saves there")

    def release(self) -> None:
        pass


def lock_directory(directory: str) -> DirectoryLock | Unlocked:
    """The exclusive lock on a local ``directory``; :class:`Unlocked` for a remote one."""
    return Unlocked(directory) if files.is_remote(directory) else DirectoryLock(directory)


@contextlib.contextmanager
def reading(checkpoint: str):
    """Holds ``checkpoint`` against deletion while the block reads it; raises
    :class:`CheckpointVanished` when it was deleted before the lock was taken. A remote checkpoint
    cannot be held (no locks): only its presence is checked."""
    if files.is_remote(checkpoint):
        if not files.isfile(files.join(checkpoint, MANIFEST)):
            raise CheckpointVanished(f"checkpoint {checkpoint} was deleted while it was being opened")
        yield checkpoint
        return
    manifest = os.path.join(checkpoint, MANIFEST)
    try:
        descriptor = os.open(manifest, os.O_RDONLY)
    except FileNotFoundError:
        raise CheckpointVanished(f"checkpoint {checkpoint} was deleted while it was being opened") from None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH)
        try:
            same = os.path.samestat(os.fstat(descriptor), os.stat(manifest))
        except FileNotFoundError:
            same = False
        if not same:  # renamed aside for deletion between the open and the lock
            raise CheckpointVanished(f"checkpoint {checkpoint} was deleted while it was being opened")
        yield checkpoint
    finally:
        os.close(descriptor)
