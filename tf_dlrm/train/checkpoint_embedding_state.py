"""The embedding optimizer's state in checkpoints, in full-table layout, resharded on restore.

The state of a table's slices (Adagrad accumulators, lazy Adam moments: ``[rows, D]``; row-wise
Adagrad: ``[rows, 1]``) is gathered exactly like the table itself, one table at a time to rank 0
(:meth:`DistributedEmbedding.get_full_table` with ``state_of``), and written as
``optimizer/embedding_<slot>_table_<t>.npy``. Restoring scatters each file to whichever ranks hold
that table's slices under the new plan, so the state follows its columns to any world size and
plan; every slice of a row gets that row's row-wise value.

Every function is collective except :func:`check`, which rank 0 runs before any weight changes.
"""

from __future__ import annotations

import numpy as np

from tf_dlrm.train import checkpoint_store as store
from tf_dlrm.train.checkpoint_store import CheckpointError, load_array


def _file(slot: str, table: int) -> str:
    return f"optimizer/embedding_{slot}_table_{table:03d}.npy"


def _state_of(updater, slot: str, table: int):
    return lambda variable: updater.slot(variable, slot, table)


def save(trainer, num_tables: int, root: str | None, files: dict) -> tuple[list, str | None]:
    """Gathers and (rank 0, when ``root`` is set) writes every slot of every table; returns the
    manifest entries and the first error met (the gathers go on, so no rank is left waiting)."""
    updater, embedding = trainer.sparse, trainer.model.embedding
    entries, error = [], None
    for slot, table in updater.state_entries(num_tables):
        row_wise = updater.table_optimizer(table).row_wise
        full = embedding.get_full_table(table, _state_of(updater, slot, table), row_wise)  # collective
        if root is not None and full is not None and error is None:
            file = _file(slot, table)
            try:
                files[file] = store.write_npy(root, file, full)
            except OSError as failure:
                error = f"cannot write {file} under {root}: {failure}"
            entries.append({"name": f"{slot}/table_{table:03d}", "slot": slot, "table": table, "file": file})
        del full
    return entries, error


def check(directory: str, manifest: dict, trainer, cardinalities, widths) -> list[str]:
    """Rank 0: the saved embedding optimizer matches the flags and every state file reads with the
    right shape; returns the files in restore order (slot, then table)."""
    updater = trainer.sparse
    saved = manifest["optimizer"].get("embedding_optimizer", "sgd")
    wanted = trainer.config.embedding_optimizer
    if saved != wanted:
        raise CheckpointError(
            f"checkpoint {directory} was trained with --embedding_optimizer={saved}; the flags give "
            f"--embedding_optimizer={wanted}, whose state cannot be restored from it"
        )
    by_name = {entry.get("name"): entry for entry in manifest.get("embedding_state", [])}
    files = []
    for slot, table in updater.state_entries(len(cardinalities)):
        optimizer = updater.table_optimizer(table)
        entry = by_name.get(f"{slot}/table_{table:03d}")
        if entry is None:
            raise CheckpointError(f"checkpoint {directory}: no {optimizer.name} state {slot!r} for table {table}")
        load_array(directory, entry["file"], (cardinalities[table], 1 if optimizer.row_wise else widths[table]), np.float32, mmap=True)
        files.append(entry["file"])
    return files


def restore(trainer, directory: str, files: list[str] | None, cardinalities, widths, is_chief: bool) -> None:
    """Collective: scatters every state file (``files`` from :func:`check`, rank 0 only) to the slices
    that hold its table under this run's plan."""
    updater, embedding = trainer.sparse, trainer.model.embedding
    for position, (slot, table) in enumerate(updater.state_entries(len(cardinalities))):
        row_wise = updater.table_optimizer(table).row_wise
        shape = (cardinalities[table], 1 if row_wise else widths[table])
        values = load_array(directory, files[position], shape, np.float32, mmap=True) if is_chief else None
        embedding.set_full_table(table, values, _state_of(updater, slot, table), row_wise)  # collective
        del values
