"""Exact evaluation metrics over a whole split, in numpy (no TensorFlow needed).

AUC is computed exactly from ranks (the Mann-Whitney U statistic), with tied scores given their
average rank, which equals the area under the ROC curve with ties drawn as diagonal segments:

    AUC = (sum of ranks of the positives - P (P + 1) / 2) / (P N)

for P positives and N negatives. No thresholds or histograms are involved, unlike
``tf.keras.metrics.AUC``'s 200-bucket approximation.
"""

from __future__ import annotations

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
