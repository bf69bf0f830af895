"""Post-hoc calibration of click probabilities, fitted on a validation split (numpy only).

A model chosen for its ranking (AUC) is often overconfident: its logits are too far from 0, so its logloss and
normalized entropy are worse than its ranking deserves. Calibration maps each logit ``z`` to a new one:

- ``platt`` (Platt 1999): ``a z + b``, two parameters;
- ``temperature`` (Guo et al. 2017, "On Calibration of Modern Neural Networks"): ``z / T``, i.e. ``a = 1 / T``, ``b = 0``;

with ``(a, b)`` minimizing the mean logloss of ``sigmoid(a z + b)`` on the ``(logit, label)`` pairs of a held-out
split. That logloss is convex in ``(a, b)`` (a logistic regression on the one feature ``z``), so a few Newton steps
find its minimum: gradient ``mean((p - y) x)``, Hessian ``mean(p (1 - p) x x^T)`` with ``x = (z, 1)``. The fit
refuses ``a <= 0`` (a model that ranks backwards): with ``a > 0`` the map is increasing, so the ranking and the
AUC are the model's own, and only the probabilities change.

    fitted = fit(validation_logits, validation_labels, "platt")
    fitted.probabilities(logits)             # float64 click probabilities
    fitted.record()                          # {"method": "platt", "scale": a, "shift": b}: what a checkpoint keeps
    Calibration.from_record(record)          # and reads back
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

PLATT = "platt"
TEMPERATURE = "temperature"
NONE = "none"
METHODS = (PLATT, TEMPERATURE, NONE)  # the values of --calibration


@dataclasses.dataclass(frozen=True)
class Calibration:
    """The logit map ``scale * z + shift`` of one fit (``temperature``: ``shift`` 0, ``scale`` 1/T).

    ``samples``: the pairs it was fitted on; ``logloss_before`` and ``logloss_after``: their mean logloss
    without and with it (None when unknown, e.g. made by hand).
    """

    method: str
    scale: float
    shift: float = 0.0
    samples: int | None = None
    logloss_before: float | None = None
    logloss_after: float | None = None

    def __post_init__(self):
        if self.method not in (PLATT, TEMPERATURE):
            raise ValueError(f"Expected a calibration method in {[PLATT, TEMPERATURE]}. Received: method={self.method!r}")
        if not (math.isfinite(self.scale) and self.scale > 0 and math.isfinite(self.shift)):
            raise ValueError(f"Expected a finite scale > 0 and a finite shift (an increasing map of logits). Received: "
                             f"scale={self.scale}, shift={self.shift}")
        if self.method == TEMPERATURE and self.shift != 0:
            raise ValueError(f"Expected shift 0 for temperature scaling. Received: shift={self.shift}")

    @property
    def temperature(self) -> float:
        return 1.0 / self.scale

    def logits(self, logits) -> np.ndarray:
        """The calibrated logits, float64."""
        return self.scale * np.asarray(logits, np.float64) + self.shift

    def probabilities(self, logits) -> np.ndarray:
        """``sigmoid(scale * z + shift)``, float64."""
        return _sigmoid(self.logits(logits))

    def record(self) -> dict:
        """What a checkpoint's manifest keeps (JSON data)."""
        record = {"method": self.method, "scale": float(self.scale), "shift": float(self.shift)}
        for name in ("samples", "logloss_before", "logloss_after"):
            if getattr(self, name) is not None:
                record[name] = getattr(self, name)
        return record

    @classmethod
    def from_record(cls, record: dict | None) -> "Calibration | None":
        """The calibration of a :meth:`record` (None for None)."""
        if record is None:
            return None
        try:
            return cls(record["method"], float(record["scale"]), float(record.get("shift", 0.0)), record.get("samples"),
                       record.get("logloss_before"), record.get("logloss_after"))
        except (KeyError, TypeError) as error:
            raise ValueError(f"Expected a calibration record {{method, scale, shift}}. Received: {record!r}") from error

    def describe(self) -> str:
        """``platt: logit * 0.8123 + -0.0412`` or ``temperature 1.2310 (logit * 0.8123)``."""
        if self.method == TEMPERATURE:
            return f"temperature {self.temperature:.4f} (logit * {self.scale:.4f})"
        return f"platt: logit * {self.scale:.4f} {'+' if self.shift >= 0 else '-'} {abs(self.shift):.4f}"


def _sigmoid(t: np.ndarray) -> np.ndarray:
    # exp of a negative argument only: no overflow for large |t|.
    e = np.exp(-np.abs(t))
    return np.where(t >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def mean_logloss(logits, labels) -> float:
    """Mean binary cross-entropy of ``sigmoid(logits)``, computed from the logits (exact for any magnitude)."""
    t = np.asarray(logits, np.float64).reshape(-1)
    y = np.asarray(labels, np.float64).reshape(-1)
    return float(np.mean(np.logaddexp(0.0, t) - y * t))


def fit(logits, labels, method: str = PLATT, iterations: int = 50, tolerance: float = 1e-12) -> Calibration:
    """The ``method`` map (``platt`` or ``temperature``) minimizing the mean logloss of ``(logits, labels)``.

    Newton's method with a halving line search from the identity map (``a = 1, b = 0``); stops when a step
    gains less than ``tolerance`` in logloss.

    Args:
        logits: ``[n]`` the model's logits (before the sigmoid).
        labels: ``[n]`` 0/1 labels.
        method: ``platt`` or ``temperature``.

    Raises:
        ValueError: an unknown method, lengths that differ, non-finite logits, labels of one class only
            (the best map then sends every probability to 0 or 1), or a best scale that is not positive
            (the logits rank the labels backwards).
    """
    if method not in (PLATT, TEMPERATURE):
        raise ValueError(f"Expected a calibration method in {[PLATT, TEMPERATURE]}. Received: method={method!r}")
    z = np.asarray(logits, np.float64).reshape(-1)
    y = np.asarray(labels, np.float64).reshape(-1)
    if z.shape != y.shape:
        raise ValueError(f"Expected as many labels as logits. Received: {y.size} labels, {z.size} logits")
    if not np.isfinite(z).all():
        raise ValueError(f"Expected finite logits to calibrate. Received: {int(np.count_nonzero(~np.isfinite(z)))} "
                         f"non-finite of {z.size}")
    positives = float(y.sum())
    if positives == 0 or positives == y.size:
        raise ValueError(f"Expected clicks and non-clicks to calibrate on. Received: {int(positives)} positive "
                         f"labels of {y.size}")
    features = np.stack([z, np.ones_like(z)], axis=1) if method == PLATT else z[:, None]
    theta = np.array([1.0, 0.0]) if method == PLATT else np.array([1.0])
    loss = before = mean_logloss(z, y)
    for _ in range(iterations):
        t = features @ theta
        p = _sigmoid(t)
        gradient = features.T @ (p - y) / y.size
        hessian = (features * (p * (1 - p))[:, None]).T @ features / y.size
        step = np.linalg.lstsq(hessian, gradient, rcond=None)[0]
        rate, improved = 1.0, False
        while rate > 1e-6:
            candidate = theta - rate * step
            candidate_loss = mean_logloss(features @ candidate, y)
            if candidate_loss <= loss:
                improved = True
                break
            rate /= 2
        if not improved:
            break
        gain = loss - candidate_loss
        theta, loss = candidate, candidate_loss
        if gain < tolerance:
            break
    if not theta[0] > 0:
        raise ValueError(f"Expected logits that rank clicks above non-clicks (a positive calibrated scale). Received: "
                         f"best scale {theta[0]:.6g} on {y.size} samples")
    return Calibration(method, float(theta[0]), float(theta[1]) if method == PLATT else 0.0, int(y.size), before, loss)
