"""``--keep_best``: remember the state of the evaluation with the best validation AUC, restore it at the end.

Each evaluation on the ``--evals_per_epoch`` (or ``--eval_every_steps``) schedule, and the final one, is offered to
:meth:`BestKeeper.on_eval`; when its AUC beats every earlier one, every rank copies its own
variables to host memory: the model's (its shards, the replicated tables, the MLPs), both
optimizers' state, the step and the learning rate. So the kept state is a whole training state of
that step, costing each rank one copy of what it already holds. At the end :meth:`restore` puts it
back on every rank; a final checkpoint then saves exactly that step, and resuming from it
continues from there.

With checkpoints the choice survives an interruption: every manifest records it (:meth:`record`), the
best step's checkpoint is kept against retention, and an interrupted run saves the best state beside
the last one. A resumed run takes the record back (:meth:`resume`); when nothing better comes, the
best state is read back from its checkpoint at the end instead of from memory.
"""

from __future__ import annotations

import numpy as np

from tf_dlrm.train.early_stopping import improves


class BestKeeper:
    """Args: trainer: the run's :class:`tf_dlrm.train.step.Trainer`; min_delta: an evaluation is kept
    when its AUC beats the kept one by more than this (``--early_stopping_min_delta``)."""

    def __init__(self, trainer, min_delta: float = 0.0):
        self.trainer = trainer
        self.min_delta = min_delta
        self.variables = (
            list(trainer.model.variables) + list(trainer.sparse.variables) + list(trainer.dense_optimizer.variables)
            + [trainer.step, trainer.learning_rate]
        )
        self.best = None  # the EvalResult of the best evaluation of this process (None: none, or one before a resume)
        self.best_auc: float | None = None
        self.step = None
        self._values: list[np.ndarray] = []

    @property
    def in_memory(self) -> bool:
        """Whether the best state is held here (else it was found before a resume, and lies in a checkpoint)."""
        return bool(self._values)

    def on_eval(self, step: int, result) -> None:
        """Every rank sees the same AUC (computed over the gathered predictions), so all keep or none."""
        if improves(result.auc, self.best_auc, self.min_delta):
            self.best, self.best_auc, self.step = result, float(result.auc), int(step)
            self._values = [np.array(v.numpy(), copy=True) for v in self.variables]

    def record(self, waited: int | None = None) -> dict | None:
        """What a checkpoint's manifest keeps of the choice (None before the first evaluation)."""
        if self.step is None:
            return None
        return {"metric": "auc", "best": self.best_auc, "best_step": self.step, "waited": waited}

    def resume(self, record: dict) -> None:
        """Takes back a manifest's :meth:`record`: the best so far was found before the resume."""
        self.best, self.best_auc, self.step, self._values = None, float(record["best"]), int(record["best_step"]), []

    def restore(self) -> None:
        """Puts the kept state back (no collective: each rank restores its own variables)."""
        for variable, value in zip(self.variables, self._values):
            variable.assign(value)
        if hasattr(self.trainer, "hot_rows_written"):
            # Kept right after an evaluation, when every rank's hot-row replicas were merged.
            self.trainer.hot_rows_written()
