"""Exact evaluation metrics over a whole split, in numpy (no TensorFlow needed).

AUC is computed exactly from ranks (the Mann-Whitney U statistic), with tied scores given their
average rank, which equals the area under the ROC curve with ties drawn as diagonal segments:

    AUC = (sum of ranks of the positives - P (P + 1) / 2) / (P N)

for P positives and N negatives. No thresholds or histograms are involved, unlike
``tf.keras.metrics.AUC``'s 200-bucket approximation.

Besides AUC and logloss, the figures CTR teams read (:class:`ClickMetrics`):

- positive rate ``p``: the mean label;
- normalized entropy (NE, He et al. 2014, the headline metric of Meta's DLRM work and TorchRec's
  ``NE``): the mean logloss divided by the entropy of ``p``,
  ``-(p log p + (1 - p) log(1 - p))``, i.e. the logloss relative to always predicting the
  observed rate (below 1: better than that constant; lower is better);
- calibration: the mean predicted probability over ``p`` (1: as many clicks predicted as observed).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

_LOGLOSS_EPSILON = 1e-7


def exact_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` against 0/1 ``labels``, ties averaged.

    Returns NaN when only one class is present (AUC is undefined then).
    """
    labels = np.asarray(labels, dtype=np.float64).reshape(-1)
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    if labels.shape != scores.shape:
        raise ValueError(f"labels and scores differ in length: {labels.shape[0]} vs {scores.shape[0]}")
    positives = float(labels.sum())
    negatives = float(labels.shape[0] - positives)
    if positives == 0 or negatives == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    # Tie groups: a new group starts wherever the sorted score changes.
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], sorted_scores.shape[0]]
    average_rank = (starts + ends + 1) / 2.0  # 1-based ranks start+1 .. end, averaged
    group_sizes = ends - starts
    ranks = np.repeat(average_rank, group_sizes)
    positive_rank_sum = float(np.dot(ranks, labels[order]))
    return (positive_rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives)


def logloss(labels: np.ndarray, probabilities: np.ndarray) -> float:
    """Mean binary cross-entropy of probabilities, clipped to [1e-7, 1 - 1e-7]."""
    labels = np.asarray(labels, dtype=np.float64).reshape(-1)
    p = np.clip(np.asarray(probabilities, dtype=np.float64).reshape(-1), _LOGLOSS_EPSILON, 1 - _LOGLOSS_EPSILON)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log1p(-p)))


def positive_rate(labels: np.ndarray) -> float:
    """The mean of the 0/1 labels (NaN for no labels)."""
    labels = np.asarray(labels, dtype=np.float64).reshape(-1)
    return float(labels.mean()) if labels.size else float("nan")


def rate_entropy(rate: float) -> float:
    """Entropy (nats) of a Bernoulli of probability ``rate``: the logloss of always predicting it."""
    if not 0 < rate < 1:
        return float("nan") if math.isnan(rate) else 0.0
    return -(rate * math.log(rate) + (1 - rate) * math.log1p(-rate))


def normalized_entropy(labels: np.ndarray, probabilities: np.ndarray) -> float:
    """Mean logloss over the entropy of the positive rate; NaN when only one class is present
    (the entropy is 0 then and NE undefined)."""
    entropy = rate_entropy(positive_rate(labels))
    return logloss(labels, probabilities) / entropy if entropy > 0 else float("nan")


def calibration(labels: np.ndarray, probabilities: np.ndarray) -> float:
    """Mean predicted probability over the positive rate; NaN without positives."""
    rate = positive_rate(labels)
    mean = float(np.mean(np.asarray(probabilities, dtype=np.float64)))
    return mean / rate if rate > 0 else float("nan")


@dataclasses.dataclass(frozen=True)
class ClickMetrics:
    """The figures of one evaluation, under the names the logs use (``ne`` for normalized entropy)."""

    auc: float
    logloss: float
    ne: float
    calibration: float
    positive_rate: float

    @classmethod
    def of(cls, labels: np.ndarray, probabilities: np.ndarray, auc: float | None = None) -> "ClickMetrics":
        """The figures of ``probabilities``; ``auc``: known already (of scores ranked as these are), not recomputed."""
        labels = np.asarray(labels, dtype=np.float64).reshape(-1)
        probabilities = np.asarray(probabilities, dtype=np.float64).reshape(-1)
        return cls(exact_auc(labels, probabilities) if auc is None else auc, logloss(labels, probabilities),
                   normalized_entropy(labels, probabilities), calibration(labels, probabilities), positive_rate(labels))

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        """One line: ``AUC 0.801234  logloss 0.451234  NE 0.871234  calibration 1.0123  positive rate 0.2512``."""
        return (f"AUC {self.auc:.6f}  logloss {self.logloss:.6f}  NE {self.ne:.6f}  calibration {self.calibration:.4f}  "
                f"positive rate {self.positive_rate:.4f}")
