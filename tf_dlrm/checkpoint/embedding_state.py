"""The embedding optimizer's state in checkpoints, sharded like its table, resharded on restore.

The state of a table's slices (Adagrad accumulators, lazy Adam moments: ``[rows, D]``; row-wise
Adagrad: ``[rows, 1]``) is written by the rank that holds it, exactly like the table itself
(:mod:`tf_dlrm.checkpoint.slices`), as ``optimizer/embedding_<slot>_table_<t>[.cols_<a>-<b>].npy``;
row-wise state once per table, by the owner of column 0 (every slice of a row holds a copy).
The rows' counts of a frequency regularizer (:mod:`tf_dlrm.embedding.row_frequency`, slot ``row_count``,
``[rows, 1]``) are saved and restored like row-wise state. Restoring reads, on each rank, the columns of the slices it holds under the new plan, so the state
follows its columns to any world size and plan; every slice of a row gets that row's row-wise value.

Nothing here is collective: :mod:`tf_dlrm.checkpoint.checkpointer` gathers the ranks' records.
"""

from __future__ import annotations

from tf_dlrm.checkpoint import slices
from tf_dlrm.checkpoint.store import CheckpointError
from tf_dlrm.embedding.row_frequency import COUNT_SLOT
from tf_dlrm.embedding.training_step import embedding_layer


def _state_of(updater, slot: str, table: int):
    return lambda variable: updater.slot(variable, slot, table)


def arrays(trainer, num_tables: int) -> list[tuple]:
    """``(slot, table, state_of, row_wise)`` of every slot of every table, for :func:`slices.save_pieces`."""
    updater = trainer.sparse
    return [(slot, table, _state_of(updater, slot, table), updater.state_row_wise(slot, table))
            for slot, table in updater.state_entries(num_tables)]


def entries(trainer, records: list, tables) -> list[dict]:
    """The manifest's ``embedding_state`` entries from every rank's records."""
    updater, found = trainer.sparse, []
    for slot, table in updater.state_entries(len(tables)):
        entry = next(e for e in slices.manifest_entries(records, tables, slot) if e["table"] == table)
        found.append({**entry, "name": f"{slot}/table_{table:03d}", "slot": slot,
                      "row_wise": bool(updater.state_row_wise(slot, table))})
    return found


def check(directory: str, manifest: dict, trainer, cardinalities, widths) -> list[str]:
    """Rank 0: the saved embedding optimizer matches the flags and every state file reads with the
    right shape; returns the entries in restore order (slot, then table), None for row counts the
    checkpoint lacks (saved without a frequency regularizer: they start at zero)."""
    updater = trainer.sparse
    saved = manifest["optimizer"].get("embedding_optimizer", "sgd")
    config = getattr(trainer, "config", None)  # main.py's flags; a library model's tables name their optimizers
    wanted = config.embedding_optimizer if config is not None else saved
    if saved is not None and saved != wanted:
        raise CheckpointError(
            f"checkpoint {directory} was trained with --embedding_optimizer={saved}; the flags give "
            f"--embedding_optimizer={wanted}, whose state cannot be restored from it"
        )
    by_name = {entry.get("name"): entry for entry in manifest.get("embedding_state", [])}
    found = []
    for slot, table in updater.state_entries(len(cardinalities)):
        owner = "frequency regularizer" if slot == COUNT_SLOT else updater.table_optimizer(table).name
        entry = by_name.get(f"{slot}/table_{table:03d}")
        if entry is None and slot == COUNT_SLOT:
            # Saved without a frequency regularizer: its rows' counts start at zero (None: nothing to read).
            found.append(None)
            continue
        if entry is None:
            raise CheckpointError(f"checkpoint {directory}: no {owner} state {slot!r} for table {table}")
        slices.open_slices(directory, entry, cardinalities[table], widths[table], updater.state_row_wise(slot, table))
        found.append(entry)
    return found


def restore(trainer, directory: str, found: list[dict], cardinalities, widths) -> None:
    """Fills the state of every slice this rank holds from the entries :func:`check` returned."""
    updater, embedding = trainer.sparse, embedding_layer(trainer.model)
    for position, (slot, table) in enumerate(updater.state_entries(len(cardinalities))):
        if found[position] is None:
            continue
        row_wise = updater.state_row_wise(slot, table)
        saved = slices.open_slices(directory, found[position], cardinalities[table], widths[table], row_wise)
        slices.restore_pieces(embedding, table, saved, _state_of(updater, slot, table), row_wise)
