"""Dynamic embedding tables (:mod:`tf_dlrm.embedding.dynamic`) in ``main.py``'s checkpoints.

A checkpoint of a model on dynamic tables is the fixed layout of :mod:`tf_dlrm.checkpoint.checkpointer`
(manifest, dense weights, optimizer state, spec copy; ``tables`` empty) plus a ``dynamic/`` folder
in the format below: one ``dynamic_rank<r>.npz`` per saving rank
(key, row, optimizer state, LRU/LFU metadata, keys waiting for ``min_count``) and the commit mark
``dynamic_tables.json``. Every rank writes its own file into the hidden temporary directory that
rank 0 publishes with one rename; the manifest lists those files with their sizes and sha256, so a
save killed half-way leaves only a hidden ``.ckpt-*.tmp`` (never taken for a checkpoint) and a
damaged file is refused by :func:`tf_dlrm.checkpoint.store.verify_files` before any restore.

Restoring re-routes every key to its owner among this run's shards (any world size). Everything
that could refuse is checked on rank 0 first (:func:`check`), so no rank fails alone mid-restore.

The rows of a layer (:func:`save_rows`, :func:`restore_rows`, usable without ``main.py``): (key, row,
optimizer state, LRU/LFU metadata) per table.

Layout of a directory (every rank writes its own file; one shared file system, as the fixed
checkpoints assume)::

    dynamic_tables.json      written last by rank 0: the commit mark (format, tables, shards, slots)
    dynamic_rank<r>.npz      rank r's live rows: per table t, ``t<t>_keys``, ``t<t>_values``,
                             ``t<t>_slot_<name>``, ``t<t>_last_used``, ``t<t>_use_count`` (and
                             ``t<t>_seen_keys``/``_counts`` of keys waiting for ``min_count``)

Restoring reads every rank's file and keeps the keys whose owner (``owner_shard(key, S)`` of the
*restoring* run) it holds, so a checkpoint of N ranks restores on any M: every key moves to its new
owner with its row and state. A shard lays its keys out in ascending key order; rows are not
observable (decisions tie-break on keys, never on rows), so training continues as if uninterrupted.
A fixed-table checkpoint (``manifest.json`` of :mod:`tf_dlrm.checkpoint.store`) is refused.
``main.py``'s checkpoints hold this layout in their ``dynamic/`` folder, written through
:func:`rank_arrays` and :func:`meta_of` (:func:`save` below).
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os

import numpy as np
import tensorflow as tf

from tf_dlrm.checkpoint import store
from tf_dlrm.io import files
from tf_dlrm.checkpoint.store import CheckpointError
from tf_dlrm.embedding.dynamic.layer import new_row_bound, rows_per_shard
from tf_dlrm.embedding.training_step import embedding_layer
from tf_dlrm.optimizers.sparse_optimizer import tf_variable
from tf_dlrm.parallel import collectives
from tf_dlrm.sharding import dynamic_routing as routing

FORMAT = "tf_dlrm.dynamic_tables"
VERSION = 1
META = "dynamic_tables.json"
FIXED_MANIFEST = "manifest.json"


def _rank_file(directory: str, rank: int) -> str:
    return files.join(directory, f"dynamic_rank{rank}.npz") if directory else f"dynamic_rank{rank}.npz"


def rank_arrays(layer, sparse_updater) -> dict:
    """This rank's live rows of every table (keys ascending per shard), as the arrays of its file."""
    arrays = {}
    slot_names = tuple(sparse_updater.slot_names) if sparse_updater is not None else ()
    for table, _ in enumerate(layer.table_configs):
        parts = []
        for shard in layer.local_shards:
            state = layer.states[shard][table].export()
            fused = state["rows"] + layer.row_offsets[table]
            storage = layer.storage[shard]
            part = {"keys": state["keys"], "values": tf.gather(tf_variable(storage), fused).numpy(),
                    "last_used": state["last_used"], "use_count": state["use_count"],
                    "seen_keys": state.get("seen_keys", np.zeros([0], np.int64)),
                    "seen_counts": state.get("seen_counts", np.zeros([0], np.int64))}
            for name in slot_names:
                part[f"slot_{name}"] = tf.gather(tf_variable(sparse_updater.slot(storage, name)), fused).numpy()
            parts.append(part)
        for field in parts[0]:
            arrays[f"t{table}_{field}"] = np.concatenate([p[field] for p in parts])
    counters = layer.counters()
    arrays["evictions"] = np.array([counters[t.name]["evictions"] for t in layer.table_configs], np.int64)
    arrays["rejections"] = np.array([counters[t.name]["rejections"] for t in layer.table_configs], np.int64)
    return arrays


def meta_of(layer, sparse_updater, world_size: int) -> dict:
    """The commit mark's contents (rank 0 writes it once every rank's file is written)."""
    slot_names = tuple(sparse_updater.slot_names) if sparse_updater is not None else ()
    return {"format": FORMAT, "version": VERSION, "world_size": world_size, "num_shards": layer.num_shards,
            "seed": layer.seed, "training_step": int(layer.training_step.numpy()),
            "tables": [_table_record(t, layer.num_shards) for t in layer.table_configs], "slots": list(slot_names)}


def _table_record(table, num_shards: int) -> dict:
    """What the manifest says of a dynamic table (the restore compares name and width)."""
    storage = table.placement.dynamic
    return {"name": table.name, "capacity": storage.capacity, "width": table.embedding_dim,
            "eviction": storage.eviction, "min_count": storage.min_count, "capacity_scope": storage.capacity_scope,
            "rows_per_shard": rows_per_shard(table, num_shards), "initial_bound": new_row_bound(table)}


def rank_file_name(rank: int) -> str:
    return _rank_file("", rank)


def save_rows(directory: str, layer, sparse_updater, env) -> None:
    """Collective: every rank writes its shards' live rows, then rank 0 the commit mark."""
    files.makedirs(directory)
    arrays = rank_arrays(layer, sparse_updater)
    temporary = _rank_file(directory, env.rank) + ".partial.npz"
    if files.is_remote(directory):
        _write_rank_file(temporary, arrays)
    else:
        np.savez(temporary, **arrays)
    files.rename(temporary, _rank_file(directory, env.rank), overwrite=True)
    collectives.barrier(env)
    if env.is_chief:
        meta = meta_of(layer, sparse_updater, env.world_size)
        with files.open_file(files.join(directory, META + ".partial"), "w") as handle:
            json.dump(meta, handle, indent=1)
        files.rename(files.join(directory, META + ".partial"), files.join(directory, META), overwrite=True)
    collectives.barrier(env)


def read_meta(directory: str) -> dict:
    """The commit mark, checked; a clear error for a fixed-table or unfinished checkpoint."""
    path = files.join(directory, META)
    if not files.isfile(path):
        if files.isfile(files.join(directory, FIXED_MANIFEST)):
            raise ValueError(f"The checkpoint {directory} holds fixed embedding tables (a {FIXED_MANIFEST}, no {META}): "
                             "a dynamic table restores only from a dynamic-table checkpoint; train the dynamic model "
                             "from scratch or keep the fixed tables.")
        raise ValueError(f"Expected a dynamic-table checkpoint in {directory}. Received: no {META} there (not a "
                         "checkpoint, or a save that did not finish).")
    with files.open_file(path) as handle:
        meta = json.load(handle)
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ValueError(f"Expected format {FORMAT} version {VERSION} in {path}. "
                         f"Received: format={meta.get('format')!r}, version={meta.get('version')!r}")
    return meta


def _check_compatible(meta: dict, layer, slot_names, path: str) -> None:
    saved = [(t["name"], t["width"]) for t in meta["tables"]]
    mine = [(t.name, t.embedding_dim) for t in layer.table_configs]
    if saved != mine:
        raise ValueError(f"The dynamic tables of {path} do not match the model's. Expected (name, width): {mine}. "
                         f"Received: {saved}")
    if meta["seed"] != layer.seed:
        raise ValueError(f"The dynamic-table checkpoint {path} was trained with seed {meta['seed']}; the model has "
                         f"seed {layer.seed} (new keys would get other rows). Received: seed={layer.seed}")
    if slot_names is not None and list(slot_names) != list(meta["slots"]):
        raise ValueError(f"The dynamic-table checkpoint {path} holds optimizer state {meta['slots']}; the embedding "
                         f"optimizer needs {list(slot_names)}.")


def check_rows(directory: str, layer, slot_names) -> tuple[dict, list]:
    """Everything :func:`restore` could refuse, checked before any weight changes (``slot_names``:
    the optimizer state to restore, None for none); returns the meta and the opened rank files.
    Capacity is checked for every shard of the restoring run, so one process can check for all."""
    meta = read_meta(directory)
    _check_compatible(meta, layer, None if slot_names is None else tuple(slot_names), directory)
    rank_files = [_rank_file(directory, r) for r in range(meta["world_size"])]
    missing = [f for f in rank_files if not files.isfile(f)]
    if missing:
        raise ValueError(f"The dynamic-table checkpoint {directory} misses {', '.join(missing)} "
                         f"(saved by {meta['world_size']} ranks).")
    if files.is_remote(directory):
        present = [files.join(directory, name) for name in files.listdir(directory)
                   if name.startswith("dynamic_rank") and name.endswith(".npz")]
    else:
        present = glob.glob(os.path.join(directory, "dynamic_rank*.npz"))
    extra = sorted(set(present) - set(rank_files))
    if extra:
        raise ValueError(f"The dynamic-table checkpoint {directory} holds files of ranks it does not list: {extra}")
    loaded = [_load_rank_file(f) for f in rank_files]
    for table, config in enumerate(layer.table_configs):
        keys = np.concatenate([f[f"t{table}_keys"] for f in loaded])
        per_shard = np.bincount(routing.owner_shard(keys, layer.num_shards), minlength=layer.num_shards)
        capacity = rows_per_shard(config, layer.num_shards)
        if per_shard.max(initial=0) > capacity:
            shard = int(np.argmax(per_shard))
            raise ValueError(f"The dynamic-table checkpoint {directory} holds {int(per_shard[shard])} keys of table "
                             f"{config.name!r} for shard {shard} of {layer.num_shards}; its capacity is "
                             f"{capacity} rows. Raise the capacity (or restore on more ranks).")
    return meta, loaded


def _load_rank_file(path: str):
    """One rank file's arrays (a remote file read whole: an .npz reads its members lazily from an open file)."""
    if not files.is_remote(path):
        return np.load(path, allow_pickle=False)
    with files.open_file(path, "rb") as handle:
        with np.load(io.BytesIO(handle.read()), allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}


def restore_rows(directory: str, layer, sparse_updater, env) -> dict:
    """Every rank loads the keys it now owns (re-routed for this run's shards); returns the meta."""
    slot_names = tuple(sparse_updater.slot_names) if sparse_updater is not None else None
    meta, loaded = check_rows(directory, layer, slot_names)
    for table, _ in enumerate(layer.table_configs):
        whole = {field: np.concatenate([f[f"t{table}_{field}"] for f in loaded])
                 for field in ("keys", "values", "last_used", "use_count", "seen_keys", "seen_counts")}
        slots = {name: np.concatenate([f[f"t{table}_slot_{name}"] for f in loaded]) for name in (slot_names or ())}
        owners = routing.owner_shard(whole["keys"], layer.num_shards)
        seen_owners = routing.owner_shard(whole["seen_keys"], layer.num_shards)
        for shard in layer.local_shards:
            mine = np.flatnonzero(owners == shard)
            mine = mine[np.argsort(whole["keys"][mine], kind="stable")]
            state = layer.states[shard][table]  # (its capacity holds them: checked above)
            waiting = seen_owners == shard
            rows = state.load(whole["keys"][mine], whole["last_used"][mine], whole["use_count"][mine],
                              whole["seen_keys"][waiting], whole["seen_counts"][waiting]).numpy()
            _write_rows(layer, shard, table, rows, whole["values"][mine], 0.0, layer.storage[shard])
            for name in slots:
                initial = float(sparse_updater.optimizer.slots[name])
                _write_rows(layer, shard, table, rows, slots[name][mine], initial, sparse_updater.slot(layer.storage[shard], name))
    # Counters: totals kept on rank 0's first shard (the per-shard split of past evictions has no
    # meaning once keys moved).
    for table, _ in enumerate(layer.table_configs):
        for index, shard in enumerate(layer.local_shards):
            state = layer.states[shard][table]
            first = env.is_chief and index == 0
            state.evictions.assign(int(sum(f["evictions"][table] for f in loaded)) if first else 0)
            state.rejections.assign(int(sum(f["rejections"][table] for f in loaded)) if first else 0)
    layer.training_step.assign(meta["training_step"])
    return meta


def _write_rows(layer, shard, table, rows, values, fill: float, variable) -> None:
    """The table's block of ``variable``: ``values`` at ``rows``, ``fill`` elsewhere."""
    start, stop = layer.row_offsets[table], layer.row_offsets[table + 1]
    block = np.full((stop - start, variable.shape[1]), fill, np.float32)
    block[rows] = values
    tf_variable(variable)[start:stop].assign(block)


# ---------------------------------------------------------------------- main.py's checkpoints

FOLDER = "dynamic"
MANIFEST_KEY = "dynamic_tables"


def is_dynamic(embedding) -> bool:
    """Whether the embedding layer holds dynamic tables (a checkpoint then holds their key -> row maps too)."""
    return getattr(embedding, "dynamic_layer", None) is not None



def _describe(path: str) -> dict:
    digest, size = hashlib.sha256(), 0
    with files.open_file(path, "rb") as handle:
        for block in iter(lambda: handle.read(8 << 20), b""):
            digest.update(block)
            size += len(block)
    return {"bytes": size, "sha256": digest.hexdigest()}


def _write_rank_file(path: str, arrays: dict) -> None:
    with files.open_file(path, "wb") as handle:
        if files.is_remote(path):  # zip writing seeks back, which a remote file being written cannot
            buffer = io.BytesIO()
            np.savez(buffer, **arrays)
            handle.write(buffer.getvalue())
        else:
            np.savez(handle, **arrays)
        files.sync(handle)


def save(trainer, env, root: str | None, records: dict, refusal) -> tuple[dict | None, str | None]:
    """Collective: every rank writes its rows under ``root`` (rank 0's temporary directory, the same on
    every rank; None when rank 0 already failed: nothing is written then); rank 0 adds the files to
    ``records`` (the manifest's ``files``). Returns the manifest record and the first error, the same on every rank: a failed
    write, or ``refusal(what)`` for NaN rows."""
    layer = embedding_layer(trainer.model).dynamic_layer
    if root is None:
        return None, None
    arrays = rank_arrays(layer, trainer.sparse)
    failure = 0
    if not all(np.isfinite(v).all() for k, v in arrays.items() if "_values" in k or "_slot_" in k):
        failure = 1
    else:
        try:
            files.makedirs(files.join(root, FOLDER))
            _write_rank_file(files.join(root, FOLDER, rank_file_name(env.rank)), arrays)
        except OSError:
            failure = 2
    # Every rank's outcome on every rank (also the barrier before rank 0 hashes the files).
    outcomes = collectives.allgather(env, tf.constant([failure], tf.int64), name="dynamic_checkpoint_outcome").numpy()
    nan = [rank for rank, code in enumerate(outcomes) if code == 1]
    if nan:
        return None, refusal(f"dynamic-table rows of rank(s) {nan} hold NaN or inf")
    unwritten = [rank for rank, code in enumerate(outcomes) if code == 2]
    if unwritten:
        return None, f"cannot write the dynamic-table rows of rank(s) {unwritten} under {files.join(root, FOLDER)}"
    if not env.is_chief:
        return None, None
    meta = meta_of(layer, trainer.sparse, env.world_size)
    names = [f"{FOLDER}/{rank_file_name(rank)}" for rank in range(env.world_size)]
    for name in names:
        records[name] = _describe(files.join(root, name))
    records[f"{FOLDER}/{META}"] = store.write_text(
        root, f"{FOLDER}/{META}", json.dumps(meta, indent=1))
    files.sync_directory(files.join(root, FOLDER))
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
            check_rows(folder_of(directory, manifest), embedding.dynamic_layer, slot_names)
        except ValueError as error:
            raise CheckpointError(str(error)) from error


def folder_of(directory: str, manifest: dict) -> str:
    return files.join(directory, manifest[MANIFEST_KEY]["folder"])


def restore(trainer, env, directory: str, manifest_record: dict, for_training: bool) -> None:
    """Collective: every rank loads the keys it owns now (and, for training, their optimizer state)."""
    restore_rows(files.join(directory, manifest_record["folder"]), embedding_layer(trainer.model).dynamic_layer,
                               trainer.sparse if for_training else None, env)
