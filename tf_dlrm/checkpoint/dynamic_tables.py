"""Dynamic embedding tables (:mod:`tf_dlrm.embedding.dynamic`) in ``main.py``'s checkpoints.

A checkpoint of a model on dynamic tables is the fixed layout of :mod:`tf_dlrm.checkpoint.checkpointer`
(manifest, dense weights, optimizer state, spec copy; ``tables`` empty) plus a ``dynamic/`` folder
in the format of :mod:`tf_dlrm.checkpoint.dynamic_state`: one ``dynamic_rank<r>.npz`` per saving rank
(key, row, optimizer state, LRU/LFU metadata, keys waiting for ``min_count``) and the commit mark
``dynamic_tables.json``. Every rank writes its own file into the hidden temporary directory that
rank 0 publishes with one rename; the manifest lists those files with their sizes and sha256, so a
save killed half-way leaves only a hidden ``.ckpt-*.tmp`` (never taken for a checkpoint) and a
damaged file is refused by :func:`tf_dlrm.checkpoint.store.verify_files` before any restore.

Restoring re-routes every key to its owner among this run's shards (any world size). Everything
that could refuse is checked on rank 0 first (:func:`check`), so no rank fails alone mid-restore.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import tensorflow as tf

from tf_dlrm.parallel import collectives
from tf_dlrm.checkpoint import dynamic_state as dynamic_checkpoint
from tf_dlrm.checkpoint import store
from tf_dlrm.checkpoint.store import CheckpointError

FOLDER = "dynamic"
MANIFEST_KEY = "dynamic_tables"


def is_dynamic(embedding) -> bool:
    return bool(getattr(embedding, "dynamic", False))


def _describe(path: str) -> dict:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(8 << 20), b""):
            digest.update(block)
            size += len(block)
    return {"bytes": size, "sha256": digest.hexdigest()}


def _write_rank_file(path: str, arrays: dict) -> None:
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)
        handle.flush()
        os.fsync(handle.fileno())


def save(trainer, env, root: str | None, files: dict, refusal) -> tuple[dict | None, str | None]:
    """Collective: every rank writes its rows under ``root`` (rank 0's temporary directory, the same on
    every rank; None when rank 0 already failed: nothing is written then); rank 0 adds the files to
    ``files``. Returns the manifest record and the first error, the same on every rank: a failed
    write, or ``refusal(what)`` for NaN rows."""
    layer = trainer.model.embedding
    if root is None:
        return None, None
    arrays = dynamic_checkpoint.rank_arrays(layer, trainer.sparse)
    failure = 0
    if not all(np.isfinite(v).all() for k, v in arrays.items() if "_values" in k or "_slot_" in k):
        failure = 1
    else:
        try:
            os.makedirs(os.path.join(root, FOLDER), exist_ok=True)
            _write_rank_file(os.path.join(root, FOLDER, dynamic_checkpoint.rank_file_name(env.rank)), arrays)
        except OSError:
            failure = 2
    # Every rank's outcome on every rank (also the barrier before rank 0 hashes the files).
    outcomes = collectives.allgather(env, tf.constant([failure], tf.int64), name="dynamic_checkpoint_outcome").numpy()
    nan = [rank for rank, code in enumerate(outcomes) if code == 1]
    if nan:
        return None, refusal(f"dynamic-table rows of rank(s) {nan} hold NaN or inf")
    unwritten = [rank for rank, code in enumerate(outcomes) if code == 2]
    if unwritten:
        return None, f"cannot write the dynamic-table rows of rank(s) {unwritten} under {os.path.join(root, FOLDER)}"
    if not env.is_chief:
        return None, None
    meta = dynamic_checkpoint.meta_of(layer, trainer.sparse, env.world_size)
    names = [f"{FOLDER}/{dynamic_checkpoint.rank_file_name(rank)}" for rank in range(env.world_size)]
    for name in names:
        files[name] = _describe(os.path.join(root, name))
    files[f"{FOLDER}/{dynamic_checkpoint.META}"] = store.write_text(
        root, f"{FOLDER}/{dynamic_checkpoint.META}", json.dumps(meta, indent=1))
    descriptor = os.open(os.path.join(root, FOLDER), os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    return {"folder": FOLDER, "files": names, "world_size": env.world_size, "num_shards": layer.num_shards}, None


def check_kind(directory: str, manifest: dict, dynamic: bool) -> None:
    """Refuses a checkpoint whose tables are of the other kind than the model's (``dynamic``)."""
    saved = manifest.get(MANIFEST_KEY)
    if dynamic and not saved:
        raise CheckpointError(
            f"checkpoint {directory} holds fixed embedding tables (its manifest lists {len(manifest['tables'])} full "
            "tables and no dynamic_tables): a model on dynamic tables (dynamic: true in the feature spec) restores "
            "only from a dynamic-table checkpoint; train the dynamic model from scratch or keep the fixed tables")
    if saved and not dynamic:
        raise CheckpointError(
            f"checkpoint {directory} holds dynamic embedding tables (key -> row maps, saved from a feature spec with "
            "dynamic: true); the flags' feature spec has fixed tables: use the dynamic spec")


def check(directory: str, manifest: dict, embedding, slot_names) -> None:
    """Rank 0, before any weight changes: the kinds match, and the dynamic tables can take the
    checkpoint (tables, seed, optimizer state ``slot_names`` or None, capacity of every shard)."""
    check_kind(directory, manifest, is_dynamic(embedding))
    if is_dynamic(embedding):
        try:
            dynamic_checkpoint.check(folder_of(directory, manifest), embedding, slot_names)
        except ValueError as error:
            raise CheckpointError(str(error)) from error


def folder_of(directory: str, manifest: dict) -> str:
    return os.path.join(directory, manifest[MANIFEST_KEY]["folder"])


def restore(trainer, env, directory: str, manifest_record: dict, for_training: bool) -> None:
    """Collective: every rank loads the keys it owns now (and, for training, their optimizer state)."""
    dynamic_checkpoint.restore(os.path.join(directory, manifest_record["folder"]), trainer.model.embedding,
                               trainer.sparse if for_training else None, env)
