"""Checkpoints of any model trained with :class:`tf_dlrm.embedding.Model` (or a hand-written loop around
a :class:`~tf_dlrm.embedding.TrainingStep`): save on N ranks, restore on M.

    path = model_checkpoint.save(model, "runs/ckpt")      # collective: every rank calls it
    model_checkpoint.restore(other_model, path)           # any world size; the same tables

Every rank writes the slices of tables (and of each table's optimizer state) it holds, chunk by
chunk, under the run's plan (:mod:`tf_dlrm.checkpoint.slices`); rank 0 writes the dense
weights, the dense optimizer's variables and the step. A restore reads, for each slice a rank holds
under its own plan, only the saved column ranges that intersect it, so a table never has to fit in
one process. Dynamic tables' live rows (keys, values, optimizer state, usage) are written by every
rank for its shards and re-routed on restore (:mod:`tf_dlrm.checkpoint.dynamic_tables`). The directory layout, atomic publication (``ckpt-<step>`` renamed from a hidden
temporary, ``latest`` updated, older ones pruned) and sha256 checks are the store's
(:mod:`tf_dlrm.checkpoint.store`); the manifest says ``format: tf_dlrm.model_checkpoint``.
"""

from __future__ import annotations

import json

import numpy as np

from tf_dlrm.checkpoint import dynamic_tables, slices, store
from tf_dlrm.parallel.collectives import allgather_json, broadcast_json
from tf_dlrm.checkpoint.store import CheckpointError
from tf_dlrm.embedding.training_step import embedding_layer
from tf_dlrm.io import files

FORMAT = "tf_dlrm.model_checkpoint"
DYNAMIC = "dynamic"
VERSION = 1


def _fixed_tables(layer) -> tuple:
    """The plan's tables (none when every table is dynamic)."""
    return () if layer.plan is None else tuple(layer.plan.tables)


def _arrays(step, layer) -> list[tuple]:
    """``(key, table, state_of, row_wise)`` of every table and every piece of its optimizer state."""
    sparse = step.sparse
    arrays = [("table", table, None, False) for table in range(len(_fixed_tables(layer)))]
    for slot, table in sparse.state_entries(len(_fixed_tables(layer))):
        arrays.append((slot, table, lambda v, s=slot, t=table: sparse.slot(v, s, t), sparse.table_optimizer(table).row_wise))
    return arrays


def _dense(model, step) -> list[tuple[str, object]]:
    """``(name, variable)`` of everything rank 0 saves whole: dense weights (replicated tables are in
    the table slices), the dense optimizer's variables and the step counter."""
    mlp = [(f"dense/{i:03d}", v) for i, v in enumerate(step.mlp)]
    optimizer = [(f"optimizer/{i:03d}", v) for i, v in enumerate(step.dense_optimizer.variables)]
    return mlp + optimizer + [("step", step.step)]


def save(model, directory: str, keep: int = 2) -> str:
    """Collective: writes a checkpoint of ``model`` (built and trained with its training step) under
    ``directory``; returns its path."""
    step, layer = model.training_step, embedding_layer(model)
    env = layer.env
    step.synchronize_hot_rows()
    number = int(step.step.numpy())
    error, temporary, final, records_of_files = None, None, None, {}
    if env.is_chief:
        try:
            temporary, final = store.prepare(directory, number)
        except (OSError, CheckpointError) as failure:
            error = f"cannot save a checkpoint under {directory}: {failure}"
    root = broadcast_json(env, temporary if error is None else None, "model_checkpoint_root")
    records, piece_error = [], None
    if root is not None:
        records, piece_error = slices.save_pieces(layer, env.rank, root, _arrays(step, layer), records_of_files)
    if root is not None and layer.dynamic_layer is not None:
        dynamic_tables.save_rows(files.join(root, DYNAMIC), layer.dynamic_layer, step.sparse, env)
    pieces = allgather_json(env, {"records": records, "files": records_of_files, "error": piece_error}, "model_checkpoint_pieces")
    error = error or next((f"rank {r}: {p['error']}" for r, p in enumerate(pieces) if p["error"]), None)
    if env.is_chief and error is None:
        try:
            records = [r for p in pieces for r in p["records"]]
            for p in pieces:
                records_of_files.update(p["files"])
            dense = []
            for name, variable in _dense(model, step):
                records_of_files[f"{name}.npy"] = store.write_npy(temporary, f"{name}.npy", np.asarray(variable.numpy()))
                dense.append({"name": name, "file": f"{name}.npy"})
            tables = _fixed_tables(layer)
            manifest = {
                "format": FORMAT, "version": VERSION, "step": number, "saved_world_size": env.world_size,
                "layer": layer.get_config(),
                "tables": slices.manifest_entries(records, tables, "table"),
                "embedding_state": [{**entry, "slot": slot} for slot in sorted({r["key"] for r in records} - {"table"})
                                    for entry in slices.manifest_entries(records, tables, slot)],
                "dense": dense, "files": records_of_files,
                "dynamic": DYNAMIC if layer.dynamic_layer is not None else None,
            }
            if files.is_remote(temporary):
                store.write_manifest(temporary, manifest)  # published by its one rename (store's docstring)
            else:
                store.write_text(temporary, store.MANIFEST, json.dumps(manifest, indent=1))
            store.publish(directory, temporary, final, keep)
        except OSError as failure:
            error = f"cannot complete checkpoint {final}: {failure}"
    if env.is_chief and error is not None and temporary is not None:
        store.discard(temporary, final)
    status = broadcast_json(env, {"error": error, "path": final}, "model_checkpoint_status")
    if status["error"]:
        raise CheckpointError(status["error"])
    return status["path"]


def restore(model, path: str) -> int:
    """Collective: fills ``model``'s tables, their optimizer state, dense weights and dense optimizer
    from the checkpoint at ``path`` (or the latest under it), whatever world size saved it; returns
    its step. ``model`` must be built with the same tables."""
    step, layer = model.training_step, embedding_layer(model)
    directory = store.resolve(path)
    with files.open_file(files.join(directory, store.MANIFEST), encoding="utf-8") as handle:
        manifest = json.load(handle)
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{directory}: not a model checkpoint (format {manifest.get('format')!r}, expected {FORMAT!r})")
    tables = _fixed_tables(layer)
    saved = {entry["name"]: entry for entry in manifest["tables"]}
    for table in tables:
        entry = saved.get(table.name)
        if entry is None or (entry["rows"], entry["dim"]) != (table.rows, table.dim):
            found = None if entry is None else f"[{entry['rows']}, {entry['dim']}]"
            raise CheckpointError(f"{directory}: table {table.name!r} is [{table.rows}, {table.dim}] in the model, "
                                  f"{found} in the checkpoint")
    states = {(entry["slot"], entry["name"]): entry for entry in manifest["embedding_state"]}
    for key, table, state_of, row_wise in _arrays(step, layer):
        name = tables[table].name
        entry = saved[name] if key == "table" else states.get((key, name))
        if entry is None:
            raise CheckpointError(f"{directory}: no {key!r} optimizer state for table {name!r} (another optimizer?)")
        opened = slices.open_slices(directory, entry, tables[table].rows, tables[table].dim, row_wise)
        slices.restore_pieces(layer, table, opened, state_of, row_wise)
    if layer.dynamic_layer is not None:
        if not manifest.get("dynamic"):
            raise CheckpointError(f"{directory}: holds no dynamic tables; the model has {layer.dynamic_layer.table_configs[0].name!r}")
        dynamic_tables.restore_rows(files.join(directory, manifest["dynamic"]), layer.dynamic_layer, step.sparse, layer.env)
    dense = {entry["name"]: entry["file"] for entry in manifest["dense"]}
    for name, variable in _dense(model, step):
        if name not in dense:
            raise CheckpointError(f"{directory}: no {name} (the model's dense part differs)")
        with files.open_file(files.join(directory, dense[name]), "rb") as handle:
            value = np.load(handle, allow_pickle=False)
        if tuple(value.shape) != tuple(variable.shape):
            raise CheckpointError(f"{directory}: {name} is {list(value.shape)}, the model's {list(variable.shape)}")
        variable.assign(value)
    step.hot_rows_written()
    return int(manifest["step"])
