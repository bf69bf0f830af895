"""Paths that may be local or remote: one set of file operations for datasets, checkpoints, logs and exports.

A path with a scheme (``gs://bucket/x``, ``s3://``, ``hdfs://``, TensorFlow's in-memory ``ram://``) is
**remote** and goes through TensorFlow's filesystem layer (``tf.io.gfile``): it works wherever
TensorFlow has a filesystem for that scheme (``gs://`` and ``ram://`` are built in; ``s3://`` and
``hdfs://`` need a plugin such as ``tensorflow-io``). Any other path is **local** and keeps the
operating system's calls (``os.pread``, ``os.rename``, ``fsync``) exactly as before, so local runs
neither slow down nor import TensorFlow for it.

What differs on remote storage, and why callers ask :func:`is_remote`:

- no atomic rename of a directory (object stores copy object by object; ``ram://`` renames only the
  directory's own entry): writers of a directory write it in place and publish it by writing one
  small marker file last (:func:`rename` of one file with ``overwrite`` is atomic where the object store's writes are);
- no ``fsync`` (an object exists whole once its writer closes it): :func:`sync` does nothing there;
- no file locks (``flock``): the checkpoint directory lock is skipped on remote directories.

Errors of TensorFlow's layer come out as the built-in ones (``FileNotFoundError``,
``FileExistsError``, ``OSError``), so callers catch one family of errors whatever the path; a scheme
TensorFlow has no filesystem for is an ``OSError`` naming the scheme and the plugin to install.
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob as local_glob
import os
import posixpath
import re
import shutil
import threading
import time

import numpy as np

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")

# Which plugin gives TensorFlow a filesystem for a scheme it lacks (named in the error).
_PLUGINS = {"s3": "pip install tensorflow-io (its S3 filesystem)", "hdfs": "pip install tensorflow-io (its HDFS filesystem)",
            "az": "pip install tensorflow-io (its Azure filesystem)", "http": "pip install tensorflow-io"}


def scheme(path: str) -> str:
    """``"gs"`` of ``gs://bucket/x``; ``""`` for a local path."""
    match = _SCHEME.match(str(path))
    return match.group(1).lower() if match else ""


def is_remote(path: str) -> bool:
    """Whether ``path`` names a file of a TensorFlow filesystem (it has a scheme), not a local one."""
    return bool(scheme(path))


# Filesystems whose files live in this process's memory and end with it.
PROCESS_LOCAL_SCHEMES = ("ram",)


def ends_with_process(path: str) -> bool:
    """Whether ``path`` is on a filesystem that ends with this process (TensorFlow's ``ram://``)."""
    return scheme(path) in PROCESS_LOCAL_SCHEMES


def _gfile():
    import tensorflow as tf  # only remote paths need TensorFlow's filesystems

    return tf.io.gfile


@contextlib.contextmanager
def _translated(path: str):
    """TensorFlow's filesystem errors as the built-in ones, naming ``path``."""
    import tensorflow as tf

    try:
        yield
    except tf.errors.NotFoundError as error:
        raise FileNotFoundError(2, f"No such file or directory ({error.message})", path) from None
    except tf.errors.AlreadyExistsError as error:
        raise FileExistsError(17, f"File exists ({error.message})", path) from None
    except tf.errors.UnimplementedError as error:
        plugin = _PLUGINS.get(scheme(path), "a TensorFlow filesystem plugin for it")
        raise OSError(f"{path}: TensorFlow has no filesystem for '{scheme(path)}://' here ({error.message}); "
                      f"install it ({plugin}) or use a local path") from None
    except tf.errors.OpError as error:
        raise OSError(f"{path}: {error.message}") from None


# ---------------------------------------------------------------------- names


def _split_remote(path: str) -> tuple[str, str]:
    match = _SCHEME.match(path)
    return path[: match.end()], path[match.end():]


def join(path: str, *parts: str) -> str:
    """``os.path.join`` for local paths, ``/``-joined for remote ones."""
    return posixpath.join(path, *parts) if is_remote(path) else os.path.join(path, *parts)


def normalize(path: str) -> str:
    """``os.path.normpath`` locally; remotely the same on the part after ``scheme://`` (the bucket kept)."""
    if not is_remote(path):
        return os.path.normpath(path)
    prefix, rest = _split_remote(path)
    rest = posixpath.normpath(rest) if rest else rest
    return prefix + ("" if rest == "." else rest)


def absolute(path: str) -> str:
    """``os.path.abspath`` locally; a remote path is absolute already (normalized)."""
    return normalize(path) if is_remote(path) else os.path.abspath(path)


def is_absolute(path: str) -> bool:
    return is_remote(path) or os.path.isabs(path)


def dirname(path: str) -> str:
    if not is_remote(path):
        return os.path.dirname(path)
    prefix, rest = _split_remote(path)
    return prefix + posixpath.dirname(rest.rstrip("/"))


def basename(path: str) -> str:
    return posixpath.basename(path.rstrip("/")) if is_remote(path) else os.path.basename(path)


def inside(path: str, directory: str) -> bool:
    """Whether ``path`` is ``directory`` or below it (links resolved for local paths)."""
    if is_remote(path) or is_remote(directory):
        path, directory = normalize(path), normalize(directory)
        return path == directory or path.startswith(directory.rstrip("/") + "/")
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return path == directory or path.startswith(directory + os.sep)


# ---------------------------------------------------------------------- queries


def exists(path: str) -> bool:
    """Whether ``path`` exists (a local broken link counts, as ``os.path.lexists``)."""
    if not is_remote(path):
        return os.path.lexists(path)
    with _translated(path):
        return _gfile().exists(path)


def isfile(path: str) -> bool:
    if not is_remote(path):
        return os.path.isfile(path)
    with _translated(path):
        return _gfile().exists(path) and not _gfile().isdir(path)


def isdir(path: str) -> bool:
    if not is_remote(path):
        return os.path.isdir(path)
    with _translated(path):
        # exists() first: isdir() answers False for a scheme without a filesystem, exists() says why.
        return _gfile().exists(path) and _gfile().isdir(path)


def getsize(path: str) -> int:
    if not is_remote(path):
        return os.path.getsize(path)
    with _translated(path):
        return int(_gfile().stat(path).length)


def listdir(path: str) -> list[str]:
    """Names in a directory (remote directory names without their trailing ``/``)."""
    if not is_remote(path):
        return os.listdir(path)
    with _translated(path):
        if not _gfile().isdir(path):
            raise FileNotFoundError(2, "No such directory", path)
        return [name.rstrip("/") for name in _gfile().listdir(path)]


def glob(pattern: str) -> list[str]:
    """Paths matching ``pattern``, whose wildcards lie in its last component only (``DIR/data_*.tfrecords``)."""
    if not is_remote(pattern):
        return local_glob.glob(pattern)
    directory, name = dirname(pattern), basename(pattern)
    try:
        return [join(directory, entry) for entry in listdir(directory) if fnmatch.fnmatchcase(entry, name)]
    except FileNotFoundError:
        return []


def walk_files(directory: str) -> list[str]:
    """Every file under a remote ``directory``, relative to it with ``/``, sorted."""
    found = []
    with _translated(directory):
        for root, _, names in _gfile().walk(directory):
            relative = root[len(directory.rstrip("/")):].strip("/")
            found += [posixpath.join(relative, name) if relative else name for name in names]
    return sorted(found)


# ---------------------------------------------------------------------- changes


def makedirs(path: str) -> None:
    """Creates ``path`` and its parents; an existing directory is fine."""
    if not is_remote(path):
        os.makedirs(path, exist_ok=True)
        return
    with _translated(path):
        _gfile().makedirs(path)


def remove(path: str) -> None:
    if not is_remote(path):
        os.remove(path)
        return
    with _translated(path):
        _gfile().remove(path)


def rmtree(path: str) -> None:
    """Removes a directory and everything in it; a missing one or a failure half-way is not an error
    (as ``shutil.rmtree(ignore_errors=True)``: callers remove what is theirs and move on)."""
    if not is_remote(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    # File by file, then the directory: a bulk delete of some TensorFlow filesystems (ram://) keeps the
    # files of subdirectories reachable by name.
    try:
        for name in walk_files(path):
            with contextlib.suppress(OSError):
                remove(join(path, name))
        with _translated(path):
            if _gfile().exists(path):
                _gfile().rmtree(path)
    except OSError:
        pass


def rename(source: str, target: str, overwrite: bool = False) -> None:
    """Renames a file (or a local directory). Without ``overwrite``, an existing remote ``target`` is an
    error (locally ``os.rename``'s rules hold); with it, the file goes over ``target``: atomic locally, and
    on remote storage where one object's copy is. Remote directories: :func:`move_tree`."""
    if not is_remote(source):
        (os.replace if overwrite else os.rename)(source, target)
        return
    with _translated(source):
        _gfile().rename(source, target, overwrite=overwrite)


def move_tree(source: str, target: str, first: tuple[str, ...] = ()) -> None:
    """Moves a directory: one ``os.rename`` locally; remotely file by file (no filesystem of TensorFlow
    renames a directory's contents atomically), the names in ``first`` before the others: a marker
    moved first makes the source stop counting as complete before any other file leaves it (the
    target must be a name readers never take for complete)."""
    if not is_remote(source):
        os.rename(source, target)
        return
    names = walk_files(source)
    if exists(target):
        raise FileExistsError(17, "File exists", target)
    ordered = [n for n in first if n in names] + [n for n in names if n not in first]
    for name in ordered:
        makedirs(dirname(join(target, name)))
        rename(join(source, name), join(target, name))
    rmtree(source)


# ---------------------------------------------------------------------- reading and writing


class _RemoteFile:
    """A ``tf.io.gfile.GFile`` whose errors are the built-in ones (np.load and callers catch OSError)."""

    def __init__(self, path: str, mode: str):
        self.path = path
        with _translated(path):
            if "w" in mode and _gfile().exists(path):
                # "w" truncates; TensorFlow's ram:// appends to an existing file instead, so start from none.
                _gfile().remove(path)
            self._file = _gfile().GFile(path, mode)
            if "r" in mode:
                self._file.size()  # a missing file fails here, as open() does, not at the first read

    def read(self, size: int = -1):
        with _translated(self.path):
            return self._file.read(size)

    def readline(self):
        with _translated(self.path):
            return self._file.readline()

    def __iter__(self):
        while True:
            line = self.readline()
            if not line:
                return
            yield line

    def write(self, data) -> int:
        if isinstance(data, memoryview):
            data = data.tobytes()
        with _translated(self.path):
            self._file.write(data)
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        with _translated(self.path):
            self._file.seek(offset, whence)
            return self._file.tell()

    def tell(self) -> int:
        with _translated(self.path):
            return self._file.tell()

    def seekable(self) -> bool:
        return True

    def flush(self) -> None:
        with _translated(self.path):
            self._file.flush()

    def close(self) -> None:
        with _translated(self.path):
            self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exception) -> None:
        self.close()


def open_file(path: str, mode: str = "r", encoding: str | None = None):
    """``open()`` for local paths (``encoding`` as given), a GFile (UTF-8 text) for remote ones."""
    if not is_remote(path):
        return open(path, mode, encoding=encoding) if "b" not in mode else open(path, mode)
    return _RemoteFile(path, mode)


def sync(handle) -> None:
    """Flushes a file written by :func:`open_file` to stable storage: ``fsync`` locally; remotely the
    object is whole once closed, so a flush is all there is."""
    handle.flush()
    if not isinstance(handle, _RemoteFile):
        os.fsync(handle.fileno())


def sync_directory(path: str) -> None:
    """``fsync`` of a local directory (its entries durable); nothing on remote storage, which has none."""
    if is_remote(path):
        return
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def read_array(handle, dtype, count: int) -> np.ndarray:
    """``count`` values of ``dtype`` from an open file's position (``np.fromfile`` on a local file)."""
    if not isinstance(handle, _RemoteFile):
        return np.fromfile(handle, dtype, count=count)
    return np.frombuffer(handle.read(count * np.dtype(dtype).itemsize), dtype)


class RandomAccessFile:
    """Reads byte ranges of one file from several threads at once.

    Locally one descriptor and ``os.pread`` (which carries its own offset, so threads share it);
    remotely one GFile per reading thread (a GFile's position is its own state).
    """

    def __init__(self, path: str):
        self.path = path
        self._remote = is_remote(path)
        self._descriptor = None if self._remote else os.open(path, os.O_RDONLY)
        self._opened = None if self._remote else self._state()
        self._local = threading.local()
        self._handles: list = []
        self._lock = threading.Lock()
        if self._remote:
            self._handle()  # a missing file fails here, as os.open does

    def _handle(self):
        handle = getattr(self._local, "handle", None)
        if handle is None:
            handle = self._local.handle = _RemoteFile(self.path, "rb")
            with self._lock:
                self._handles.append(handle)
        return handle

    def read(self, size: int, offset: int) -> bytes:
        """At most ``size`` bytes at ``offset`` (fewer past the end of the file)."""
        if not self._remote:
            return os.pread(self._descriptor, size, offset)
        handle = self._handle()
        handle.seek(offset)
        return handle.read(size)

    def size(self) -> int:
        return os.fstat(self._descriptor).st_size if not self._remote else getsize(self.path)

    def _state(self) -> tuple[int, int]:
        status = os.fstat(self._descriptor)
        return status.st_size, status.st_mtime_ns

    def changed(self) -> str | None:
        """How the file was written to since it was opened, or None: call it after a read, and a read that got any
        bytes of a writer (one that overwrites the file in place keeps its size) finds the modification time moved
        on (the kernel updates it before it copies the bytes). A file replaced by a rename is no change: the
        descriptor still reads the file it opened. Local files only (None for remote ones)."""
        if self._remote:
            return None
        now = self._state()
        if now == self._opened:
            return None
        when = time.strftime("%H:%M:%S", time.localtime(now[1] / 1e9))
        return f"written to since the job opened it (modified at {when}; {self._opened[0]} bytes then, {now[0]} now)"

    def close(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None
        with self._lock:
            for handle in self._handles:
                with contextlib.suppress(OSError):
                    handle.close()
            self._handles.clear()
