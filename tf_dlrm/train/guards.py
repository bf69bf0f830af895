"""Guards of a training run against silently wrong results: non-finite losses, scores and weights.

- :class:`LossWatch` keeps the loss tensors of the steps since the last progress line and reads them
  all at once when the loop prints (the hot loop still syncs with the host only there), so a run
  whose loss turns NaN or inf stops within ``--print_freq`` steps, naming the exact step.
- :func:`check_scores` refuses to compute an AUC from non-finite predictions (an AUC of all-NaN
  scores is a meaningless number that looks like a result).
- :func:`non_finite_arrays` tells a checkpoint which arrays it must not save.
"""

from __future__ import annotations

import math

import numpy as np


class NonFiniteError(ValueError):
    """A loss, score or weight is NaN or inf: the run diverged or its input is broken."""


class LossWatch:
    """The loss of every step between two reads, and the last finite one seen.

    Args:
        first_step: the step number the next :meth:`add` belongs to, minus one (the loop's start step).
    """

    def __init__(self, first_step: int = 0):
        self._pending: list = []
        self._last_step = first_step
        self.last_finite: tuple[int, float] | None = None

    def add(self, loss) -> None:
        """Records a step's loss tensor without reading it (no host sync)."""
        self._pending.append(loss)

    def read(self, rates: str) -> float:
        """Reads the pending losses; returns the latest.

        Args:
            rates: the learning rate(s) in force, for the message.

        Raises:
            NonFiniteError: naming the first step whose loss is not finite, the learning rates and
                the last finite loss.
        """
        values = np.asarray([float(loss) for loss in self._pending], np.float64)
        first = self._last_step + 1
        self._pending.clear()
        self._last_step += values.size
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            finite = values[: bad[0]]
            if finite.size:
                self.last_finite = (first + bad[0] - 1, float(finite[-1]))
            last = (
                f"the last finite loss was {self.last_finite[1]:.6g} at step {self.last_finite[0]}"
                if self.last_finite else "no finite loss was seen"
            )
            raise NonFiniteError(
                f"training loss is {values[bad[0]]} at step {first + bad[0]} ({rates}); {last}. The run diverged "
                "(or its input holds non-finite values): stopping. Lower --learning_rate, or add --warmup_steps"
            )
        if values.size:
            self.last_finite = (self._last_step, float(values[-1]))
            return float(values[-1])
        return math.nan


def check_scores(scores: np.ndarray, where: str) -> None:
    """Raises NonFiniteError when any predicted score is NaN or inf (no AUC is computed from them)."""
    check_score_count(int(np.count_nonzero(~np.isfinite(scores))), int(np.size(scores)), where)


def check_score_count(bad: int, total: int, where: str) -> None:
    """As :func:`check_scores`, from the count of non-finite scores (what every rank learns from the
    one rank that held the scores)."""
    if bad:
        raise NonFiniteError(
            f"{where}: {bad} of {total} predicted scores are NaN or inf: the model's weights are not "
            "finite, or so large that its forward pass overflows (a diverged run); no AUC is reported"
        )


def non_finite_arrays(named_arrays) -> list[str]:
    """Names of the arrays (``(name, array)`` pairs) holding a NaN or inf."""
    return [name for name, array in named_arrays if not np.isfinite(array).all()]
