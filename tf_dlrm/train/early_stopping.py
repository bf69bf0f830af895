"""``--early_stopping_patience``: stop once the validation metric has not improved for N evaluations.

The metric is ``--early_stopping_metric``: the AUC (higher is better) or the logloss (lower is
better; on one split its order is that of normalized entropy). An evaluation improves when it beats
the best so far by more than ``min_delta`` (``--early_stopping_min_delta``); the first evaluation
always does. :class:`tf_dlrm.train.keep_best.BestKeeper` keeps the state by the same rule
(:func:`improves`), so the state restored at the end is the one the patience was counted from.
"""

from __future__ import annotations

METRICS = {"auc": ("AUC", 1.0), "logloss": ("logloss", -1.0)}  # name on the console, sign of "better"


def improves(value: float, best: float | None, min_delta: float = 0.0, metric: str = "auc") -> bool:
    """Whether ``value`` beats ``best`` (None: nothing yet) by more than ``min_delta``; NaN never does."""
    if best is None:
        return True
    sign = METRICS[metric][1]
    return sign * (value - best) > min_delta


def metric_name(metric: str) -> str:
    return METRICS[metric][0]


class EarlyStopping:
    """Counts evaluations since the last improvement.

    Args:
        patience: evaluations without improvement after which :meth:`update` says stop (>= 1).
        min_delta: the margin the metric must beat the best by to count as an improvement (>= 0).
        metric: ``"auc"`` or ``"logloss"`` (:data:`METRICS`).
    """

    def __init__(self, patience: int, min_delta: float = 0.0, metric: str = "auc"):
        if patience < 1 or min_delta < 0 or metric not in METRICS:
            raise ValueError(f"Expected patience >= 1, min_delta >= 0 and metric in {tuple(METRICS)}. Received: "
                             f"patience={patience}, min_delta={min_delta}, metric={metric!r}")
        self.patience, self.min_delta, self.metric = patience, min_delta, metric
        self.best: float | None = None
        self.best_step: int | None = None
        self.waited = 0

    def resume(self, record: dict) -> None:
        """Takes back the counts a checkpoint recorded (:meth:`tf_dlrm.train.keep_best.BestKeeper.record`)."""
        self.best, self.best_step, self.waited = float(record["best"]), int(record["best_step"]), int(record.get("waited") or 0)

    def update(self, step: int, result) -> bool:
        """Records the evaluation of ``step`` (an EvalResult); True when training should stop."""
        value = getattr(result, self.metric)
        if improves(value, self.best, self.min_delta, self.metric):
            self.best, self.best_step, self.waited = value, int(step), 0
            return False
        self.waited += 1
        return self.waited >= self.patience
