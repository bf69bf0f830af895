"""The rule early stopping and ``--keep_best`` share (:mod:`tf_dlrm.train.early_stopping`), for both metrics.

The AUC improves upwards and the logloss downwards, each only by more than ``min_delta``; a NaN never
improves; the count of evaluations since the best resets on an improvement and stops at the patience.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from tf_dlrm.train.early_stopping import EarlyStopping, improves
from tf_dlrm.train.loop_config import LoopConfig


def test_improves_up_for_auc_and_down_for_logloss():
    assert improves(0.5, None) and improves(0.9, None, metric="logloss")
    assert improves(0.71, 0.70, 0.005) and not improves(0.704, 0.70, 0.005)
    assert not improves(0.69, 0.70)
    assert improves(0.40, 0.45, 0.01, "logloss") and not improves(0.445, 0.45, 0.01, "logloss")
    assert not improves(0.46, 0.45, metric="logloss")
    assert not improves(math.nan, 0.7) and not improves(math.nan, 0.45, metric="logloss")


def test_logloss_counts_from_its_minimum_not_from_the_best_auc():
    stopper = EarlyStopping(patience=2, metric="logloss")
    # (AUC, logloss): the AUC keeps rising while the logloss turns up after the second evaluation.
    evaluations = [(0.70, 0.50), (0.72, 0.45), (0.73, 0.47), (0.74, 0.49)]
    stops = [stopper.update(step, SimpleNamespace(auc=auc, logloss=loss)) for step, (auc, loss) in enumerate(evaluations, 1)]
    assert stops == [False, False, False, True]
    assert stopper.best_step == 2 and stopper.best == 0.45


def test_an_unknown_metric_is_refused():
    with pytest.raises(ValueError, match="early_stopping_metric='ne'"):
        LoopConfig(early_stopping_metric="ne")
    with pytest.raises(ValueError, match="metric='ne'"):
        EarlyStopping(2, metric="ne")
