"""Post-hoc calibration (``tf_dlrm.calibration``): the fit lowers the logloss of overconfident logits to the true
model's, brings mean predicted over observed to 1, leaves calibrated logits almost as they are, and refuses what it
cannot fit."""

from __future__ import annotations

import numpy as np
import pytest

from tf_dlrm.calibration import Calibration, fit, mean_logloss
from tf_dlrm.metrics import ClickMetrics


def _clicks(samples: int = 200_000, seed: int = 0):
    """Labels drawn from known logits: ``true`` is calibrated by construction (the labels' own model)."""
    rng = np.random.default_rng(seed)
    true = rng.normal(-1.2, 1.3, samples)
    labels = (rng.random(samples) < 1 / (1 + np.exp(-true))).astype(np.float64)
    return true, labels


@pytest.mark.parametrize("method", ["platt", "temperature"])
def test_overconfident_logits_are_brought_back(method):
    true, labels = _clicks()
    overconfident = 3.0 * true  # an AUC-chosen model's habit: right ranking, logits too far from 0
    before = ClickMetrics.of(labels, 1 / (1 + np.exp(-overconfident)))
    fitted = fit(overconfident, labels, method)
    after = ClickMetrics.of(labels, fitted.probabilities(overconfident))
    oracle = mean_logloss(true, labels)
    # The best map of 3z is 1/3 (the true logits): the logloss of the labels' own model, within sampling noise.
    assert fitted.scale == pytest.approx(1 / 3, rel=0.02) and abs(fitted.shift) < 0.02
    assert after.logloss < before.logloss - 0.05 and after.logloss == pytest.approx(oracle, abs=2e-4)
    assert after.ne < before.ne and abs(after.calibration - 1) < 0.01
    assert after.auc == pytest.approx(before.auc, abs=1e-12)  # an increasing map: the same ranking
    # From the logits, exactly (ClickMetrics clips probabilities to [1e-7, 1 - 1e-7], which the tails of 3z reach).
    assert fitted.logloss_before == pytest.approx(mean_logloss(overconfident, labels), rel=1e-12)
    assert fitted.logloss_after == pytest.approx(after.logloss, abs=1e-6) and fitted.samples == labels.size


def test_platt_also_corrects_a_shifted_rate_which_temperature_cannot():
    """Logits of a model trained at another positive rate (e.g. negatives downsampled): a shift, not a scale."""
    true, labels = _clicks(seed=1)
    shifted = true + 1.0
    platt, temperature = fit(shifted, labels, "platt"), fit(shifted, labels, "temperature")
    assert platt.shift == pytest.approx(-1.0, abs=0.03) and platt.scale == pytest.approx(1.0, abs=0.03)
    assert abs(ClickMetrics.of(labels, platt.probabilities(shifted)).calibration - 1) < 0.01
    assert platt.logloss_after < temperature.logloss_after < temperature.logloss_before


@pytest.mark.parametrize("method", ["platt", "temperature"])
def test_calibrated_logits_are_left_almost_unchanged(method):
    true, labels = _clicks(seed=2)
    fitted = fit(true, labels, method)
    assert fitted.scale == pytest.approx(1.0, abs=0.02) and abs(fitted.shift) < 0.02
    probabilities = 1 / (1 + np.exp(-true))
    assert np.max(np.abs(fitted.probabilities(true) - probabilities)) < 0.01
    assert fitted.logloss_before - fitted.logloss_after < 1e-4


def test_the_record_round_trips_and_bad_ones_are_refused():
    fitted = fit(*_clicks(20_000), "platt")
    again = Calibration.from_record(fitted.record())
    assert again == fitted and Calibration.from_record(None) is None
    np.testing.assert_array_equal(again.probabilities([-40.0, 0.0, 40.0]), fitted.probabilities([-40.0, 0.0, 40.0]))
    assert Calibration("temperature", 0.5).temperature == 2.0
    for record, fragment in (({"method": "isotonic", "scale": 1.0}, "method"), ({"method": "platt", "scale": -1.0}, "scale > 0"),
                             ({"method": "platt"}, "{method, scale, shift}"), ({"method": "temperature", "scale": 1.0, "shift": 1.0},
                                                                               "shift 0")):
        with pytest.raises(ValueError, match=fragment.replace("{", r"\{").replace("}", r"\}")):
            Calibration.from_record(record)


def test_what_cannot_be_fitted_is_refused_in_words():
    true, labels = _clicks(1000)
    with pytest.raises(ValueError, match="clicks and non-clicks"):
        fit(true, np.zeros_like(labels))
    with pytest.raises(ValueError, match="rank clicks above non-clicks"):
        fit(-true, labels)
    with pytest.raises(ValueError, match="as many labels"):
        fit(true, labels[:-1])
    with pytest.raises(ValueError, match="non-finite"):
        fit(np.r_[true[:-1], np.nan], labels)
    with pytest.raises(ValueError, match="method"):
        fit(true, labels, "isotonic")
