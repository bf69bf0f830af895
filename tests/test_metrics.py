"""Exact AUC against its definition counted over every positive/negative pair (ties count one
half), and logloss against hand-computed values.

scikit-learn was the reference here once; it is no longer installed: Keras imports it (and SciPy)
whenever it is present, which cost every TensorFlow process of the suite about 1.1 s of its 4.4 s
start-up."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tf_dlrm.metrics import ClickMetrics, calibration, exact_auc, logloss, normalized_entropy, positive_rate


def pairwise_auc(labels, scores) -> float:
    """P(score of a positive > score of a negative) + P(tie) / 2, over all pairs (O(P * N))."""
    labels, scores = np.asarray(labels, bool), np.asarray(scores, np.float64)
    positives, negatives = scores[labels][:, None], scores[~labels][None, :]
    wins = np.count_nonzero(positives > negatives) + 0.5 * np.count_nonzero(positives == negatives)
    return wins / (positives.size * negatives.size)


def test_pairwise_reference_on_a_hand_counted_case():
    # positives 0.8, 0.4; negatives 0.4, 0.1: pairs (0.8>0.4, 0.8>0.1, 0.4=0.4, 0.4>0.1) = 3.5 / 4
    assert pairwise_auc([1, 0, 1, 0], [0.8, 0.4, 0.4, 0.1]) == 0.875


@pytest.mark.parametrize("seed", range(6))
def test_exact_auc_matches_the_pairwise_count_with_many_ties(seed):
    rng = np.random.default_rng(seed)
    count = int(rng.integers(300, 5000))
    labels = rng.random(count) < rng.uniform(0.05, 0.6)
    labels[:2] = [True, False]  # both classes present
    # Few distinct scores, weakly related to the labels: most scores are tied with others.
    scores = np.round(rng.random(count) + 0.3 * labels, decimals=int(rng.integers(0, 3)))
    assert len(np.unique(scores)) <= 131 < count / 2  # at most 131 values for 300+ samples
    assert exact_auc(labels, scores) == pytest.approx(pairwise_auc(labels, scores), abs=1e-9)


def test_exact_auc_on_float32_scores_and_column_shapes():
    rng = np.random.default_rng(7)
    labels = (rng.random((1000, 1)) < 0.3).astype(np.float32)
    scores = rng.random((1000, 1)).astype(np.float32)
    assert exact_auc(labels, scores) == pytest.approx(pairwise_auc(labels.ravel(), scores.ravel()), abs=1e-9)


def test_exact_auc_hand_computed():
    # positives 0.4, 0.35; negatives 0.1, 0.8: pairs (0.4>0.1), (0.35>0.1) right, two wrong -> 2/4.
    assert exact_auc([0, 1, 1, 0], [0.1, 0.4, 0.35, 0.8]) == 0.5
    assert exact_auc([0, 0, 1, 1], [0.1, 0.2, 0.3, 0.4]) == 1.0
    assert exact_auc([1, 1, 0, 0], [0.1, 0.2, 0.3, 0.4]) == 0.0
    # a tie between a positive and a negative counts one half: (1 + 0.5) / 2
    assert exact_auc([0, 1, 0, 1], [0.1, 0.5, 0.5, 0.9]) == pytest.approx(0.875)


def test_exact_auc_single_class_and_bad_shapes():
    assert math.isnan(exact_auc([1, 1, 1], [0.2, 0.3, 0.4]))
    assert math.isnan(exact_auc([0, 0], [0.2, 0.3]))
    with pytest.raises(ValueError, match="differ in length"):
        exact_auc([0, 1, 1], [0.2, 0.3])


def test_logloss_hand_computed():
    expected = -(math.log(0.8) + math.log(1 - 0.4)) / 2
    assert logloss([1, 0], [0.8, 0.4]) == pytest.approx(expected, rel=1e-12)
    assert logloss([1, 0, 1], [0.5, 0.5, 0.5]) == pytest.approx(math.log(2), rel=1e-12)


def test_logloss_clips_certain_mistakes():
    # p = 0 for a positive is clipped to 1e-7 instead of giving infinity
    assert logloss([1, 0], [0.0, 0.0]) == pytest.approx(-(math.log(1e-7) + math.log(1 - 1e-7)) / 2, rel=1e-9)
    assert logloss([0], [1.0]) == pytest.approx(-math.log(1e-7), rel=1e-6)


def test_normalized_entropy_calibration_and_positive_rate_hand_computed():
    labels, scores = [1, 0, 0, 0], [0.5, 0.25, 0.25, 0.5]
    # p = 1/4; the entropy of p: -(1/4 ln 1/4 + 3/4 ln 3/4); logloss: -(ln .5 + 2 ln .75 + ln .5) / 4
    entropy = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    mean_logloss = -(2 * math.log(0.5) + 2 * math.log(0.75)) / 4
    assert positive_rate(labels) == 0.25
    assert normalized_entropy(labels, scores) == pytest.approx(mean_logloss / entropy, rel=1e-12)
    assert calibration(labels, scores) == pytest.approx(0.375 / 0.25, rel=1e-12)  # mean score 1.5 / 4
    # Predicting the observed rate everywhere: NE exactly 1, calibration exactly 1.
    assert normalized_entropy(labels, [0.25] * 4) == pytest.approx(1.0, rel=1e-12)
    assert calibration(labels, [0.25] * 4) == 1.0


def test_click_metrics_match_a_numpy_reference():
    rng = np.random.default_rng(11)
    labels = (rng.random(5000) < 0.2).astype(np.float32)
    scores = np.clip(0.15 + 0.3 * labels + 0.2 * rng.standard_normal(5000), 0, 1).astype(np.float32)
    y, p = labels.astype(np.float64), np.clip(scores.astype(np.float64), 1e-7, 1 - 1e-7)
    rate = y.mean()
    reference_logloss = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    reference_ne = reference_logloss / -(rate * np.log(rate) + (1 - rate) * np.log(1 - rate))
    metrics = ClickMetrics.of(labels, scores)
    assert metrics.auc == exact_auc(labels, scores)
    assert metrics.logloss == pytest.approx(reference_logloss, rel=1e-12)
    assert metrics.ne == pytest.approx(reference_ne, rel=1e-12)
    assert metrics.calibration == pytest.approx(scores.astype(np.float64).mean() / rate, rel=1e-12)
    assert metrics.positive_rate == rate
    assert list(metrics.as_dict()) == ["auc", "logloss", "ne", "calibration", "positive_rate"]
    assert "NE" in metrics.describe() and "calibration" in metrics.describe()


def test_metrics_of_one_class_are_undefined_not_infinite():
    assert math.isnan(normalized_entropy([0, 0, 0], [0.1, 0.2, 0.3]))
    assert math.isnan(normalized_entropy([1, 1], [0.9, 0.8]))
    assert math.isnan(calibration([0, 0], [0.1, 0.2]))
    assert calibration([1, 1], [0.5, 1.0]) == 0.75
