"""``--keep_best``: remember the state of the evaluation with the best validation AUC, restore it at the end.

Each evaluation on the ``--evals_per_epoch`` (or ``--eval_every_steps``) schedule, and the final one, is offered to
:meth:`BestKeeper.on_eval`; when its AUC beats every earlier one, every rank copies its own
variables to host memory: the model's (its shards, the replicated tables, the MLPs), both
optimizers' state, the step and the learning rate. So the kept state is a whole training state of
that step, costing each rank one copy of what it already holds. At the end :meth:`restore` puts it
back on every rank; a final checkpoint then saves exactly that step, and resuming from it
continues from there.
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
        self.best = None  # the EvalResult
        self.step = None
        self._values: list[np.ndarray] = []

    def on_eval(self, step: int, result) -> None:
        """Every rank sees the same AUC (computed over the gathered predictions), so all keep or none."""
        if improves(result.auc, None if self.best is None else self.best.auc, self.min_delta):
            self.best, self.step = result, int(step)
            self._values = [np.array(v.numpy(), copy=True) for v in self.variables]

    def restore(self) -> None:
        """Puts the kept state back (no collective: each rank restores its own variables)."""
        for variable, value in zip(self.variables, self._values):
            variable.assign(value)
        if hasattr(self.trainer, "hot_rows_written"):
            # Kept right after an evaluation, when every rank's hot-row replicas were merged.
            self.trainer.hot_rows_written()
