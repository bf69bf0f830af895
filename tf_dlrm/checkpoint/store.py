"""The on-disk checkpoint format: layout, manifest, checksums, safe reading, atomic publish, retention.

One checkpoint is a directory ``ckpt-<step>`` under ``--save_checkpoint_path``::

    manifest.json          format, step, data position, learning rate, RNG, model, and every other
                           file with its size and sha256
    model_config.json      the model and optimizer the weights belong to
    feature_spec.yaml      a copy of the dataset's feature spec (sources and metadata included)
    tables/table_000.npy   one ``[rows, dim]`` float32 table per categorical feature, spec order, or
    tables/table_000.cols_0-4.npy  its column slices as the ranks held them (manifest: ``slices``)
    dense/<name>.npy       MLP weights (identical on every rank: data-parallel)
    optimizer/<name>.npy   the dense optimizer's variables (iterations, rate, Adam moments)
    optimizer/embedding_<slot>_table_000[.cols_0-4].npy
                           the embedding optimizer's state of each table, sliced like it
                           (``[rows, width]``, or ``[rows, 1]`` for row-wise Adagrad)

Tables are written by their owners as column slices (:mod:`tf_dlrm.checkpoint.slices`); the
manifest lists each table's slices by column range, so a checkpoint restores on any number of ranks
with any plan, each rank reading only the columns it owns.

Atomic publish: a save writes ``.ckpt-<step>.tmp`` (:func:`prepare`), fsyncs it, and publishes it
with one ``os.rename`` (:func:`publish`); only published directories with a ``manifest.json``
(written last, :func:`write_manifest`) count as checkpoints, so a run killed at any moment leaves
the previous checkpoint complete and loadable. Then the ``latest`` pointer file is replaced
atomically and all but the newest ``--keep_checkpoints`` are deleted.

Safe to load: the manifest is JSON, the spec copy is read with ``yaml.safe_load`` and arrays with
``np.load(allow_pickle=False)``; file names in a manifest must stay inside the checkpoint; every
file's size and sha256 are verified before any weight is touched. An untrusted checkpoint can at
worst be refused (:class:`CheckpointError`, naming the file).

Remote storage (``gs://``, ``s3://``, ``ram://``: :mod:`tf_dlrm.io.files`) has no atomic rename of a
directory, so a save there writes ``ckpt-<step>`` in place and the manifest, written last under a
temporary name and renamed onto ``manifest.json`` (one object), is what publishes it; a ``ckpt-<step>``
without a manifest is a save that did not finish, never listed, and removed by the next save.
Retention deletes a remote checkpoint's manifest first, so it stops counting before its files go.

Plain files only (no TensorFlow, no collectives): the training side that gathers the state and
runs on every rank is :mod:`tf_dlrm.checkpoint.checkpointer`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
import re

import numpy as np
import yaml

from tf_dlrm.calibration import Calibration
from tf_dlrm.io import files

FORMAT = "tf_dlrm.checkpoint"
VERSION = 2  # 2: tables and their optimizer state as the owners' column slices; 1 (full tables) still reads
READABLE_VERSIONS = (1, 2)
MANIFEST = "manifest.json"
MODEL_CONFIG = "model_config.json"
SPEC_COPY = "feature_spec.yaml"
LATEST = "latest"
VERIFY_THREADS = 8  # checksum threads of verify_files: past a few, the disk is the limit
_NAME = re.compile(r"^ckpt-(\d+)$")
_SAFE_FILE = re.compile(r"^[A-Za-z0-9_\-][A-Za-z0-9_.\-]*(/[A-Za-z0-9_\-][A-Za-z0-9_.\-]*)*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, corrupt, unsafe, or does not fit the model of the flags."""


# ---------------------------------------------------------------------- finding checkpoints


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:08d}"


def list_checkpoints(directory: str) -> list[tuple[int, str]]:
    """Published checkpoints under ``directory`` (``ckpt-<step>`` holding a manifest), oldest first.

    Temporary (``.ckpt-*.tmp``) and half-deleted directories never match.
    """
    try:
        names = files.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for name in names:
        match = _NAME.match(name)
        path = files.join(directory, name)
        if match and files.isfile(files.join(path, MANIFEST)):
            found.append((int(match.group(1)), path))
    return sorted(found)


def latest_checkpoint(directory: str) -> str | None:
    """The newest published checkpoint under ``directory``, or None."""
    found = list_checkpoints(directory)
    return found[-1][1] if found else None


def resolve(path: str) -> str:
    """``path`` if it is a checkpoint, else the latest checkpoint under it."""
    if files.isfile(files.join(path, MANIFEST)):
        return path
    latest = latest_checkpoint(path)
    if latest is None:
        if not files.exists(path):
            raise CheckpointError(f"Checkpoint path not found: {path}")
        raise CheckpointError(
            f"{path} is not a complete checkpoint (no {MANIFEST}) and holds no complete checkpoint (ckpt-<step>/{MANIFEST})"
        )
    return latest


# ---------------------------------------------------------------------- reading and verifying


def read_manifest(directory: str) -> dict:
    """The parsed, structurally checked manifest of a checkpoint directory."""
    path = files.join(directory, MANIFEST)
    try:
        with files.open_file(path, "rb") as handle:
            manifest = json.loads(handle.read().decode("utf-8"))
    except FileNotFoundError as error:
        raise CheckpointError(f"{directory}: no {MANIFEST}: not a complete checkpoint") from error
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: not valid JSON: {error}") from error
    _check_manifest(manifest, path)
    return manifest


def _check_manifest(manifest, path: str) -> None:
    def fail(what):
        raise CheckpointError(f"{path}: malformed manifest: {what}")

    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        fail(f"expected format {FORMAT!r}")
    if manifest.get("version") not in READABLE_VERSIONS:
        fail(f"version {manifest.get('version')!r}; this code reads versions {list(READABLE_VERSIONS)}")
    for key, kind in (("step", int), ("position", dict), ("model", dict), ("optimizer", dict), ("files", dict),
                      ("tables", list), ("dense", list), ("optimizer_state", list)):
        # A library model's checkpoint (tf_dlrm.checkpoint.model_checkpoint) has no model record.
        if key == "model" and "model" in manifest and manifest["model"] is None:
            continue
        if not isinstance(manifest.get(key), kind) or isinstance(manifest.get(key), bool):
            fail(f"key {key!r} missing or not a {kind.__name__}")
    for name, entry in manifest["files"].items():
        if not isinstance(name, str) or not _SAFE_FILE.match(name) or ".." in name.split("/"):
            fail(f"unsafe file name {name!r} (names must be relative and stay inside the checkpoint)")
        if not isinstance(entry, dict) or not isinstance(entry.get("bytes"), int) or not _SHA256.match(str(entry.get("sha256"))):
            fail(f"file {name!r} needs integer 'bytes' and a hex 'sha256'")
    for key in ("tables", "dense", "optimizer_state", "loss_scale", "embedding_state"):
        for item in manifest.get(key, []):
            sliced = key in ("tables", "embedding_state") and isinstance(item, dict) and "slices" in item
            listed = [s.get("file") if isinstance(s, dict) else None for s in item["slices"]] if sliced and \
                isinstance(item["slices"], list) and item["slices"] else [item.get("file") if isinstance(item, dict) else None]
            if not isinstance(item, dict) or not isinstance(item.get("name"), str) or any(f not in manifest["files"] for f in listed):
                fail(f"every {key} entry needs a 'name' and a 'file' (or 'slices' of files) listed under 'files'. Received: {item!r}")
            if sliced and not all(isinstance(s.get("columns"), list) and len(s["columns"]) == 2
                                  and all(isinstance(c, int) for c in s["columns"]) for s in item["slices"]):
                fail(f"every slice of a {key} entry needs integer 'columns' [start, end]. Received: {item!r}")
            if sliced and not all("rows" not in s or (isinstance(s["rows"], list) and len(s["rows"]) == 2
                                                      and all(isinstance(r, int) for r in s["rows"])) for s in item["slices"]):
                fail(f"a row band of a {key} entry needs integer 'rows' [start, end]. Received: {item!r}")
    for name in (MODEL_CONFIG, SPEC_COPY) if manifest["model"] is not None else ():
        if name not in manifest["files"]:
            fail(f"{name} is not listed")
    if manifest.get("calibration") is not None:
        try:
            Calibration.from_record(manifest["calibration"])
        except ValueError as error:
            fail(f"calibration: {error}")


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with files.open_file(path, "rb") as handle:
        for block in iter(lambda: handle.read(8 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_files(directory: str, manifest: dict, threads: int | None = None) -> None:
    """Checks every listed file's size and sha256; raises CheckpointError naming the first bad one.

    Paths and sizes first (cheap), then the checksums on ``threads`` threads (default: one per core,
    at most 8): hashlib releases the GIL while it hashes, so a checkpoint of a few large table files
    verifies at several cores' speed instead of one. The error names the first bad file in manifest
    order, whichever thread finds it first.
    """
    for name, entry in manifest["files"].items():
        path = files.join(directory, name)
        # (Remote storage has no links: the names were checked to stay inside by _check_manifest.)
        if not files.is_remote(directory) and not files.inside(path, directory):
            raise CheckpointError(f"checkpoint {directory}: file {name} points outside the checkpoint")
        try:
            size = files.getsize(path)
        except OSError as error:
            raise CheckpointError(f"checkpoint {directory}: file {name} is missing ({error.strerror})") from error
        if size != entry["bytes"]:
            raise CheckpointError(
                f"checkpoint {directory}: file {name} has {size} bytes but the manifest says {entry['bytes']}: "
                "truncated or replaced; refusing to load it"
            )
    names = list(manifest["files"])
    threads = threads or min(VERIFY_THREADS, os.cpu_count() or 1, max(1, len(names)))
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="checkpoint-sha256")
    try:
        digests = pool.map(lambda name: _sha256(files.join(directory, name)), names)
        for name, digest in zip(names, digests):
            if digest != manifest["files"][name]["sha256"]:
                raise CheckpointError(
                    f"checkpoint {directory}: file {name} fails its sha256 checksum: corrupt or modified; refusing to load it"
                )
    finally:
        pool.shutdown(cancel_futures=True)  # a bad file stops the files not yet started


def load_array(directory: str, name: str, shape, dtype, mmap: bool = False) -> np.ndarray:
    """One verified ``.npy`` file, refused unless it is a plain array of ``shape`` and ``dtype``."""
    path = files.join(directory, name)
    try:
        if files.is_remote(path):  # (no memory map of a remote file)
            with files.open_file(path, "rb") as handle:
                array = np.load(handle, allow_pickle=False)
        else:
            array = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise CheckpointError(f"checkpoint {directory}: file {name} is not a plain .npy array: {error}") from error
    if not isinstance(array, np.ndarray) or array.dtype != np.dtype(dtype) or tuple(array.shape) != tuple(shape):
        found = (getattr(array, "dtype", type(array).__name__), getattr(array, "shape", None))
        raise CheckpointError(
            f"checkpoint {directory}: file {name} holds {found[0]} {found[1]}; expected {np.dtype(dtype).name} {tuple(shape)}"
        )
    return array


def model_record(spec, model_config, identity: dict) -> dict:
    """What the weights' shapes depend on: the model (``identity``: its ``name``, a registered name or
    an import path, and its own ``config``; see :func:`tf_dlrm.cli.builder.model_identity`), the
    tables' width and the spec's features."""
    return {
        "name": identity["name"],
        "config": dict(identity["config"]),
        "embedding_dim": model_config.embedding_dim,
        "num_numerical": len(spec.numerical_features),
        "categorical_features": list(spec.categorical_features),
        "cardinalities": list(spec.cardinalities()),
    }


def check_compatible(directory: str, manifest: dict, spec, model_config, identity: dict) -> None:
    """Refuses a checkpoint whose model, model config or feature spec differs from the flags', naming
    each differing flag (``identity["flags"]``: the model's ``{config key: flag name}``)."""
    saved, current = manifest["model"], model_record(spec, model_config, identity)
    differences = [f"--{flag}: {saved.get(key)!r} in the checkpoint, {current[key]!r} from the flags"
                   for key, flag in (("name", "model"), ("embedding_dim", "embedding_dim")) if saved.get(key) != current[key]]
    if saved.get("name") == current["name"]:  # the same model: compare its own hyper-parameters too
        saved_config = saved.get("config") if isinstance(saved.get("config"), dict) else {}
        flags = identity.get("flags", {})
        # A hyper-parameter the checkpoint does not record came after it was saved; a model's new
        # hyper-parameters default to what it did before, so only the recorded ones are compared.
        differences += [f"--{flags.get(key, key)}: {saved_config.get(key)!r} in the checkpoint, {current['config'].get(key)!r} "
                        "from the flags" for key in sorted(saved_config)
                        if saved_config.get(key) != current["config"].get(key)]
    if differences:
        raise CheckpointError(f"checkpoint {directory} was saved for a different model: " + "; ".join(differences))
    try:
        with files.open_file(files.join(directory, SPEC_COPY), "r", encoding="utf-8") as handle:
            saved_spec = yaml.safe_load(handle)
        saved_features, saved_channels = saved_spec["feature_spec"], saved_spec["channel_spec"]
        if not isinstance(saved_features, dict) or not isinstance(saved_channels, dict):
            raise TypeError("feature_spec and channel_spec must be mappings")
    except (yaml.YAMLError, TypeError, KeyError) as error:
        raise CheckpointError(f"checkpoint {directory}: {SPEC_COPY} is not a feature spec: {error}") from error
    problems = []
    for channel in ("label", "numerical", "categorical"):
        if list(saved_channels.get(channel) or []) != list(spec.channel_spec.get(channel) or []):
            problems.append(f"channel {channel}: {saved_channels.get(channel)} in the checkpoint, {spec.channel_spec.get(channel)} now")
    for name in spec.categorical_features + spec.numerical_features:
        for key in ("dtype", "cardinality"):
            entry = saved_features.get(name)
            before, now = (entry if isinstance(entry, dict) else {}).get(key), spec.feature_spec.get(name, {}).get(key)
            if before != now:
                problems.append(f"feature {name}: {key} {before!r} in the checkpoint, {now!r} in {spec.source}")
    if problems:
        raise CheckpointError(
            f"checkpoint {directory} was trained on a different feature spec than {spec.source}: " + "; ".join(problems[:5])
        )
    if saved.get("num_numerical") != current["num_numerical"] or saved.get("cardinalities") != current["cardinalities"]:
        raise CheckpointError(f"checkpoint {directory}: its manifest disagrees with its own {SPEC_COPY}")


# ---------------------------------------------------------------------- writing


class _HashingSink:
    """A write-only file object that hashes what passes through (np.save writes in chunks to it)."""

    def __init__(self, handle):
        self.handle, self.digest, self.size = handle, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.digest.update(data)
        self.size += len(data)
        return self.handle.write(data)


def _write_file(root: str, name: str, write) -> dict:
    path = files.join(root, name)
    files.makedirs(files.dirname(path))
    with files.open_file(path, "wb") as handle:
        sink = _HashingSink(handle)
        write(sink)
        files.sync(handle)
    return {"bytes": sink.size, "sha256": sink.digest.hexdigest()}


def write_npy(root: str, name: str, array: np.ndarray) -> dict:
    """Writes ``array`` as ``root/name`` (.npy, fsynced); returns its manifest entry (bytes, sha256, shape, dtype)."""
    array = np.asarray(array)
    if not array.flags.c_contiguous:  # (not np.ascontiguousarray: it turns scalars into [1] arrays)
        array = array.copy(order="C")
    entry = _write_file(root, name, lambda sink: np.lib.format.write_array(sink, array, allow_pickle=False))
    return {**entry, "shape": list(array.shape), "dtype": array.dtype.name}


def write_text(root: str, name: str, text: str) -> dict:
    """Writes ``text`` as ``root/name`` (UTF-8, fsynced); returns its manifest entry (bytes, sha256)."""
    return _write_file(root, name, lambda sink: sink.write(text.encode("utf-8")))


def replace_manifest(directory: str, manifest: dict) -> None:
    """Replaces a published checkpoint's manifest (a field added at the end of the run: the calibration) in one
    rename: a reader sees the old manifest or the new one, both complete."""
    _check_manifest(manifest, files.join(directory, MANIFEST))
    write_text(directory, MANIFEST + ".partial", json.dumps(manifest, indent=1))
    files.rename(files.join(directory, MANIFEST + ".partial"), files.join(directory, MANIFEST), overwrite=True)
    if not files.is_remote(directory):
        files.sync_directory(directory)


def write_manifest(root: str, manifest: dict) -> None:
    """Writes the manifest after syncing every other file's directory, then syncs ``root``."""
    if files.is_remote(root):
        # In place (see the module docstring): whole under a temporary name, then one rename publishes it.
        write_text(root, MANIFEST + ".partial", json.dumps(manifest, indent=1))
        files.rename(files.join(root, MANIFEST + ".partial"), files.join(root, MANIFEST), overwrite=True)
        return
    for folder in ("tables", "dense", "optimizer"):  # the other ranks' files were fsynced by their writers
        if os.path.isdir(os.path.join(root, folder)):
            files.sync_directory(os.path.join(root, folder))
    # The manifest goes last: a directory without one is never taken for a checkpoint.
    write_text(root, MANIFEST, json.dumps(manifest, indent=1))
    files.sync_directory(root)


# ---------------------------------------------------------------------- publishing and retention


def prepare(save_path: str, step: int) -> tuple[str, str]:
    """Clears stale directories and creates the one a save of ``step`` writes into (hidden locally; the
    final one itself on remote storage); returns it and the final path."""
    files.makedirs(save_path)
    remove_stale(save_path)
    name = checkpoint_name(step)
    final = files.join(save_path, name)
    if files.exists(final):
        raise CheckpointError(f"{final} exists already")
    temporary = final if files.is_remote(save_path) else os.path.join(save_path, f".{name}.tmp")
    if files.is_remote(save_path):
        files.makedirs(temporary)
    else:
        os.makedirs(temporary)
    return temporary, final


def is_published(path: str) -> bool:
    """Whether ``path`` is a complete checkpoint (it holds its manifest)."""
    return files.isfile(files.join(path, MANIFEST))


def discard(temporary: str, final: str) -> None:
    """Removes the directory of a save that failed, unless it was published (remote saves write in place)."""
    if temporary == final and is_published(final):
        return
    files.rmtree(temporary)


def replace_text_atomically(path: str, text: str) -> None:
    temporary = f"{path}.tmp"
    with files.open_file(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
        files.sync(handle)
    files.rename(temporary, path, overwrite=True)


def publish(save_path: str, temporary: str, final: str, keep: int, protect=(), supersede: bool = False,
            latest: bool = True) -> list[str]:
    """Renames a complete ``temporary`` to ``final`` (remote: its manifest published it already), then
    :func:`make_latest` (``latest=False``: only retention); returns the checkpoints it superseded."""
    if temporary != final:
        os.rename(temporary, final)  # the one atomic step that makes the checkpoint exist
        files.sync_directory(save_path)
    if not latest:
        retain(save_path, keep, (*protect, final))
        return []
    return make_latest(save_path, final, keep, protect, supersede)


def make_latest(save_path: str, final: str, keep: int, protect=(), supersede: bool = False) -> list[str]:
    """Points ``latest`` at the published ``final`` and keeps the newest ``keep`` besides ``final`` and
    the paths in ``protect``.

    ``supersede``: ``final`` is the state the run chose (``--keep_best``) and the checkpoints of later
    steps hold states it rejected; they are deleted, so that the newest checkpoint (what ``--resume`` and
    ``--restore_checkpoint_path=DIR`` take) is the chosen one. Returns their paths.
    """
    superseded = []
    if supersede:
        step = int(_NAME.match(files.basename(final)).group(1))
        superseded = [path for later, path in list_checkpoints(save_path) if later > step]
        for path in superseded:
            _delete(save_path, path)
    replace_text_atomically(files.join(save_path, LATEST), files.basename(final) + "\n")
    retain(save_path, keep, (*protect, final))
    return superseded


def remove_stale(directory: str) -> None:
    """Removes temporary and half-deleted checkpoint directories left by killed runs (on remote
    storage also the ``ckpt-<step>`` directories without a manifest: saves that did not finish)."""
    for name in files.listdir(directory):
        if name.startswith(".ckpt-") and (name.endswith(".tmp") or name.endswith(".deleting")):
            files.rmtree(files.join(directory, name))
        elif files.is_remote(directory) and _NAME.match(name) and not is_published(files.join(directory, name)):
            files.rmtree(files.join(directory, name))


def exclusive_if_unread(checkpoint: str) -> int | None:
    """An open descriptor holding ``checkpoint``'s manifest exclusively (close it after deleting), -1
    when it has no manifest or lies on remote storage (no locks there), or None when a reader holds it
    (:func:`tf_dlrm.checkpoint.lock.reading`)."""
    if files.is_remote(checkpoint):
        return -1
    try:
        descriptor = os.open(os.path.join(checkpoint, MANIFEST), os.O_RDONLY)
    except FileNotFoundError:
        return -1
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        return None
    return descriptor


def retain(directory: str, keep: int, protect=()) -> None:
    """Deletes all but the newest ``keep`` checkpoints and those in ``protect`` (paths), except one
    that a reader holds (:mod:`tf_dlrm.checkpoint.lock`): a later save deletes it."""
    kept = {files.basename(path) for path in protect if path}
    for _, path in list_checkpoints(directory)[:-keep]:
        if files.basename(path) not in kept:
            _delete(directory, path)


def _delete(directory: str, path: str) -> None:
    """Deletes one checkpoint, unless a reader holds it (hidden by a rename before the slow delete)."""
    held = exclusive_if_unread(path)
    if held is None:
        return
    try:
        if files.is_remote(path):
            files.remove(files.join(path, MANIFEST))  # no longer a checkpoint, before its files go
            files.rmtree(path)
            return
        doomed = os.path.join(directory, f".{os.path.basename(path)}.deleting")
        os.rename(path, doomed)
        files.rmtree(doomed)
    finally:
        if held >= 0:
            os.close(held)
