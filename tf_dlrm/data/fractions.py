"""Splitting a sequence of rows by fraction, in row order: train, then validation, then test.

With ``n`` rows, the last ``floor(n * test_fraction + 0.5)`` are ``test`` and the
``floor(n * valid_fraction + 0.5)`` before them ``validation`` (none when ``valid_fraction`` is 0:
two splits, the Kaggle convention); never shuffled, so the test rows are the latest ones. Shared by
:mod:`preprocessing.splits` and :mod:`tf_dlrm.data.transcode`.

On the command line ``--valid_fraction`` defaults to ``--test_fraction`` (:func:`command_line_valid_fraction`): a
run asked for a held-out test split also gets a validation split to choose its state by, so that the test
figures stay held-out (``main.py`` never chooses by ``test``); ``--valid_fraction=0`` keeps two splits.
"""

from __future__ import annotations

import math

TRAIN, VALIDATION, TEST = "train", "validation", "test"


def check_fractions(test_fraction: float, valid_fraction: float) -> None:
    """Raises ValueError unless both fractions lie in [0, 1) and leave some rows to train on."""
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"--test_fraction must lie in [0, 1). Received: test_fraction={test_fraction}")
    if not 0.0 <= valid_fraction < 1.0 or test_fraction + valid_fraction >= 1.0:
        raise ValueError(f"--valid_fraction must lie in [0, 1 - test_fraction). Received: valid_fraction={valid_fraction}, "
                         f"test_fraction={test_fraction}")


def command_line_valid_fraction(valid_fraction: float | None, test_fraction: float) -> float:
    """``--valid_fraction``'s value: as given, else (None) the same share as ``--test_fraction``."""
    return test_fraction if valid_fraction is None else valid_fraction


def fraction_ranges(total: int, test_fraction: float, valid_fraction: float = 0.0) -> list[tuple[str, int, int]]:
    """``(split, first row, end row)`` of each split, in order: train, validation (when
    ``valid_fraction`` > 0), test. Ranges may be empty."""
    check_fractions(test_fraction, valid_fraction)
    num_test = int(math.floor(total * test_fraction + 0.5))
    num_valid = int(math.floor(total * valid_fraction + 0.5))
    first_valid, first_test = total - num_test - num_valid, total - num_test
    ranges = [(TRAIN, 0, first_valid)]
    if valid_fraction > 0:
        ranges.append((VALIDATION, first_valid, first_test))
    return ranges + [(TEST, first_test, total)]
