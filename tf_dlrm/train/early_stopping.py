"""``--early_stopping_patience``: stop once the validation AUC has not improved for N evaluations.

An evaluation improves when its AUC exceeds the best so far by more than ``min_delta``
(``--early_stopping_min_delta``); the first evaluation always does. :class:`tf_dlrm.train.keep_best.BestKeeper`
keeps the state by the same rule (:func:`improves`), so the state restored at the end is the one
whose AUC the patience was counted from.
"""

from __future__ import annotations


def improves(auc: float, best: float | None, min_delta: float = 0.0) -> bool:
    """Whether ``auc`` beats ``best`` (None: nothing yet) by more than ``min_delta``; a NaN AUC never does."""
    return best is None or auc > best + min_delta


class EarlyStopping:
    """Counts evaluations since the last improvement.

    Args:
        patience: evaluations without improvement after which :meth:`update` says stop (>= 1).
        min_delta: the margin an AUC must exceed the best by to count as an improvement (>= 0).
    """

    def __init__(self, patience: int, min_delta: float = 0.0):
        if patience < 1 or min_delta < 0:
            raise ValueError(f"Expected patience >= 1 and min_delta >= 0. Received: patience={patience}, min_delta={min_delta}")
        self.patience, self.min_delta = patience, min_delta
        self.best: float | None = None
        self.best_step: int | None = None
        self.waited = 0

    def resume(self, record: dict) -> None:
        """Takes back the counts a checkpoint recorded (:meth:`tf_dlrm.train.keep_best.BestKeeper.record`)."""
        self.best, self.best_step, self.waited = float(record["best"]), int(record["best_step"]), int(record.get("waited") or 0)

    def update(self, step: int, auc: float) -> bool:
        """Records the evaluation of ``step``; True when training should stop."""
        if improves(auc, self.best, self.min_delta):
            self.best, self.best_step, self.waited = auc, int(step), 0
            return False
        self.waited += 1
        return self.waited >= self.patience
