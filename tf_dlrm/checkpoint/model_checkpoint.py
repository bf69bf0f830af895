"""Checkpoints of any model trained with :class:`tf_dlrm.embedding.Model` (or a hand-written loop around
a :class:`~tf_dlrm.embedding.TrainingStep`): save on N ranks, restore on M.

    path = model_checkpoint.save(model, "runs/ckpt")      # collective: every rank calls it
    model_checkpoint.restore(other_model, path)           # any world size; the same tables

One format with ``main.py``'s: these are the run's own checkpoints (:class:`tf_dlrm.checkpoint.checkpointer.Checkpointer`,
the layout of :mod:`tf_dlrm.checkpoint.store`) without a run around them, so a ``main.py`` checkpoint of a
library model (``--model=package.module:Name``) restores into the same class in a user's script, and a
script's checkpoint restores under ``main.py``. Every rank writes the slices of tables (and of each table's
optimizer state) it holds, chunk by chunk, under the run's plan (:mod:`tf_dlrm.checkpoint.slices`); rank 0
writes the dense weights and the dense optimizer's variables, matched by name on restore. A restore reads,
for each slice a rank holds under its own plan, only the saved column ranges that intersect it, so a table
never has to fit in one process. Dynamic tables' live rows are re-routed on restore
(:mod:`tf_dlrm.checkpoint.dynamic_tables`). A script's checkpoint records no feature spec, flags or data
position: ``main.py`` checks its tables and weights by shape and name only.
"""

from __future__ import annotations

from tf_dlrm.checkpoint.checkpointer import Checkpointer
from tf_dlrm.embedding.training_step import embedding_layer
from tf_dlrm.train.reporting import Reporter


def _checkpointer(model, directory: str | None = None, keep: int = 2) -> Checkpointer:
    env = embedding_layer(model).env
    return Checkpointer(model.training_step, None, None, None, env, Reporter(False), save_path=directory, keep=keep)


def save(model, directory: str, keep: int = 2) -> str:
    """Collective: writes a checkpoint of ``model`` (built and trained with its training step) under
    ``directory``, keeping the newest ``keep``; returns its path."""
    return _checkpointer(model, directory, keep).save(int(model.training_step.step.numpy()))


def restore(model, path: str) -> int:
    """Collective: fills ``model``'s tables, their optimizer state, dense weights and dense optimizer
    from the checkpoint at ``path`` (or the newest under it), whatever world size saved it; returns its
    step. ``model`` must be built (called once) with the same tables and dense weights."""
    return _checkpointer(model).restore(path, for_training=True, required=True)["step"]
