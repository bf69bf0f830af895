"""``--keep_best``: remember the state of the evaluation with the best validation metric, restore it at the end.

The metric is ``--early_stopping_metric`` (AUC or logloss).

Each evaluation on the ``--evals_per_epoch`` (or ``--eval_every_steps``) schedule, and the final one, is offered to
:meth:`BestKeeper.on_eval`; when it beats every earlier one, every rank copies its own
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

from tf_dlrm.train.early_stopping import improves, metric_name


class BestKeeper:
    """Args: trainer: the run's :class:`tf_dlrm.train.step.Trainer`; min_delta: an evaluation is kept
    when it beats the kept one by more than this (``--early_stopping_min_delta``); metric: ``"auc"`` or
    ``"logloss"``."""

    def __init__(self, trainer, min_delta: float = 0.0, metric: str = "auc"):
        self.trainer = trainer
        self.min_delta, self.metric = min_delta, metric
        self.variables = (
            list(trainer.model.variables) + list(trainer.sparse.variables) + list(trainer.dense_optimizer.variables)
            + [trainer.step, trainer.learning_rate]
        )
        self.best = None  # the EvalResult of the best evaluation of this process (None: none, or one before a resume)
        self.best_value: float | None = None  # of the metric
        self.step = None
        self._values: list[np.ndarray] = []

    @property
    def in_memory(self) -> bool:
        """Whether the best state is held here (else it was found before a resume, and lies in a checkpoint)."""
        return bool(self._values)

    def on_eval(self, step: int, result) -> None:
        """Every rank sees the same metrics (computed over the gathered predictions), so all keep or none."""
        value = getattr(result, self.metric)
        if improves(value, self.best_value, self.min_delta, self.metric):
            self.best, self.best_value, self.step = result, float(value), int(step)
            self._values = [np.array(v.numpy(), copy=True) for v in self.variables]

    def record(self, waited: int | None = None) -> dict | None:
        """What a checkpoint's manifest keeps of the choice (None before the first evaluation)."""
        if self.step is None:
            return None
        return {"metric": self.metric, "best": self.best_value, "best_step": self.step, "waited": waited}

    def resume(self, record: dict) -> None:
        """Takes back a manifest's :meth:`record`: the best so far was found before the resume."""
        self.best, self.best_value, self.step, self._values = None, float(record["best"]), int(record["best_step"]), []

    def describe(self) -> str:
        """``validation AUC 0.812345`` (or logloss) of the kept state."""
        return f"validation {metric_name(self.metric)} {self.best_value:.6f}"

    def restore(self) -> None:
        """Puts the kept state back (no collective: each rank restores its own variables)."""
        for variable, value in zip(self.variables, self._values):
            variable.assign(value)
        if hasattr(self.trainer, "hot_rows_written"):
            # Kept right after an evaluation, when every rank's hot-row replicas were merged.
            self.trainer.hot_rows_written()
