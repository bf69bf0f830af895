"""Which splits a run evaluates, which one may choose its state, and which one it reports as held-out.

``--valid_split`` and ``--test_split`` default to ``auto``, resolved against the dataset's splits:

- the validation split (evaluated during training, the one ``--keep_best``, ``--early_stopping_patience`` and
  ``--auc_threshold`` choose by) is the first of :data:`VALIDATION_NAMES` the dataset has;
- the test split (evaluated once at the end, at the chosen state, never choosing) is ``test``;
- a dataset with ``test`` and no validation split (NVIDIA's train/test layout) is evaluated on ``test`` during
  training, but nothing chooses on it: the figures of a split that chose the state would overstate what the
  model does on new data. ``--select_on_test`` allows the choice there anyway, and says so in the summary.

A named split is taken as given; ``''`` or ``none`` (unless the dataset has a split of that name) is no split.
Pure Python: the flags' rules, tested without a model.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

AUTO = "auto"
# Split names that hold validation data, in the order auto looks for them: the data tools here write
# ``validation``; ``valid`` is a common name for it elsewhere (e.g. benchmarks/quality_real.py's datasets).
VALIDATION_NAMES = ("validation", "valid", "val")
TEST_NAME = "test"  # NVIDIA DeepLearningExamples' name for the held-out split


@dataclasses.dataclass(frozen=True)
class EvaluationSplits:
    """The resolved splits of a run: ``valid`` evaluated during training, ``test`` once at the end ('': none)."""

    valid: str
    test: str
    # Whether evaluations of ``valid`` may choose the reported state or stop the run.
    selects: bool

    @property
    def valid_role(self) -> str:
        """What the evaluated split is to the reader of the summary: ``validation``, or ``test`` when it is the
        test split (evaluated during training without a validation split)."""
        return "test" if self.valid == TEST_NAME else "validation"


def _given(flag_value: str, splits: Sequence[str]) -> str | None:
    """The split a flag names (None for auto, '' for no split)."""
    if flag_value == AUTO and AUTO not in splits:
        return None
    if not flag_value or (flag_value == "none" and "none" not in splits):
        return ""
    return flag_value


def resolve(valid_flag: str, test_flag: str, splits: Sequence[str], select_on_test: bool = False) -> EvaluationSplits:
    """The splits ``--valid_split`` and ``--test_split`` name on a dataset with ``splits``.

    A split named by hand that the dataset lacks is returned as named (the caller refuses it, naming the flag);
    a split is never both the validation and the test split (auto leaves the test split out then).
    """
    valid = _given(valid_flag, splits)
    if valid is None:
        valid = next((name for name in VALIDATION_NAMES if name in splits), TEST_NAME if TEST_NAME in splits else "")
    test = _given(test_flag, splits)
    if test is None:
        test = TEST_NAME if TEST_NAME in splits and valid != TEST_NAME else ""
    return EvaluationSplits(valid, test, selects=bool(valid) and (valid != TEST_NAME or select_on_test))


def check_selection(resolved: EvaluationSplits, splits: Sequence[str], keep_best: bool, early_stopping_patience: int,
                    auc_threshold: float | None) -> None:
    """Raises ValueError, naming the flag, when a flag would choose by the test split without ``--select_on_test``."""
    if not resolved.valid or resolved.selects:
        return
    asked = [flag for flag, given in (("--early_stopping_patience", early_stopping_patience > 0),
                                      ("--keep_best", keep_best and not early_stopping_patience),
                                      ("--auc_threshold", auc_threshold is not None)) if given]
    if asked:
        raise ValueError(
            f"{asked[0]} would choose by the '{resolved.valid}' split, the held-out test split the run reports (the "
            f"dataset's splits: {list(splits)}, none of them a validation split {list(VALIDATION_NAMES)}): give the "
            f"dataset a validation split (docs/data.md), or add --select_on_test to choose on the test split anyway")
