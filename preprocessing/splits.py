"""Which output split every input row goes to.

Rows are addressed by *data line*: the 0-based index of a line in its file after the header (bad
rows count, so a split boundary never depends on which rows are valid). Three rules:

- ``fraction``: all inputs are read as one sequence in the order given; with ``n`` data lines in
  total, the last ``floor(n * test_fraction + 0.5)`` go to ``test`` and the rest to ``train``
  (the Kaggle convention: split by row order, never shuffled); with ``valid_fraction`` > 0, the
  ``floor(n * valid_fraction + 0.5)`` lines before the test lines go to ``validation`` (three
  splits: train, validation to select on, test to report);
- ``days``: the Criteo 1TB layout, files named ``day_<N>`` (any extension): days 0-22 are
  ``train``; day 23's first ``ceil(n / 2)`` data lines are ``test`` and the rest ``validation``;
- ``none``: every row goes to ``train`` (e.g. new days transformed with a saved vocabulary).
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Sequence

import numpy as np

from tf_dlrm.data.fractions import fraction_ranges
from preprocessing.criteo_format import InputFormat

TRAIN = "train"
TEST = "test"
VALIDATION = "validation"
SPLIT_RULES = ("fraction", "days", "none")
LAST_DAY = 23
_DAY = re.compile(r"^day_(\d+)(\..*)?$")


@dataclasses.dataclass(frozen=True)
class InputFile:
    """One input file as the engines see it."""

    index: int
    path: str  # as given on the command line
    compressed: bool  # gzip, decided by the ``.gz`` extension (as Spark decides)
    input_format: InputFormat
    data_lines: int  # lines after the header, bad ones included

    @property
    def first_data_line_number(self) -> int:
        """1-based line number in the file of data line 0."""
        return 2 if self.input_format.header else 1


@dataclasses.dataclass(frozen=True)
class SplitPlan:
    """Per file, the data lines where a split starts: ``starts[f][k]`` opens split ``codes[f][k]``."""

    rule: str
    names: tuple[str, ...]
    starts: tuple[tuple[int, ...], ...]
    codes: tuple[tuple[int, ...], ...]
    details: dict = dataclasses.field(default_factory=dict)

    def split_of(self, file_index: int, first_data_line: int, count: int) -> np.ndarray:
        """``[count]`` int8 split index of data lines ``first_data_line ..`` of a file (-1: none)."""
        starts = np.asarray(self.starts[file_index], dtype=np.int64)
        codes = np.asarray(self.codes[file_index] + (-1,), dtype=np.int8)
        lines = np.arange(first_data_line, first_data_line + count, dtype=np.int64)
        position = np.searchsorted(starts, lines, side="right") - 1
        return codes[np.where(position < 0, len(starts), position)]

    def overlaps(self, file_index: int, first_data_line: int, count: int, split: str) -> bool:
        """Whether any of those data lines belongs to ``split``."""
        if split not in self.names or count <= 0:
            return False
        return bool((self.split_of(file_index, first_data_line, count) == self.names.index(split)).any())

    def metadata(self) -> dict:
        return {"rule": self.rule, **self.details}


def day_of(path: str) -> int | None:
    match = _DAY.match(os.path.basename(path))
    return int(match.group(1)) if match else None


def make_plan(files: Sequence[InputFile], rule: str, test_fraction: float, valid_fraction: float = 0.0) -> SplitPlan:
    """Builds the split plan for ``rule`` (one of :data:`SPLIT_RULES`).

    Raises:
        ValueError: bad ``test_fraction`` or ``valid_fraction``, or (``days``) a file not named ``day_<0..23>``.
    """
    if rule == "fraction":
        return _fraction_plan(files, test_fraction, valid_fraction)
    if rule == "days":
        days = []
        for f in files:
            day = day_of(f.path)
            if day is None or not 0 <= day <= LAST_DAY:
                raise ValueError(
                    f"--split=days expects files named day_0 .. day_{LAST_DAY} (optionally with an extension). "
                    f"Received: {f.path}"
                )
            days.append(day)
        names = ([TRAIN] if any(d < LAST_DAY for d in days) else []) + ([TEST, VALIDATION] if LAST_DAY in days else [])
        starts, codes = [], []
        for f, day in zip(files, days):
            if day < LAST_DAY:
                starts.append((0,)), codes.append((names.index(TRAIN),))
            else:
                starts.append((0, (f.data_lines + 1) // 2))
                codes.append((names.index(TEST), names.index(VALIDATION)))
        return SplitPlan(rule, tuple(names), tuple(starts), tuple(codes), {"days": days})
    if rule == "none":
        return SplitPlan(rule, (TRAIN,), tuple((0,) for _ in files), tuple((0,) for _ in files))
    raise ValueError(f"--split must be one of {list(SPLIT_RULES)}. Received: split={rule!r}")


def _fraction_plan(files: Sequence[InputFile], test_fraction: float, valid_fraction: float) -> SplitPlan:
    """train, then (``valid_fraction`` > 0) validation, then test, by row order over all files."""
    ranges = fraction_ranges(sum(f.data_lines for f in files), test_fraction, valid_fraction)
    names = tuple(name for name, _, _ in ranges)
    starts, codes, offset = [], [], 0
    for f in files:
        spans = [(max(begin - offset, 0), code) for code, (_, begin, end) in enumerate(ranges)
                 if begin < end and begin < offset + f.data_lines and end > offset]
        if not spans:  # no data line: the split the file's position falls in
            spans = [(0, max(code for code, (_, begin, _) in enumerate(ranges) if begin <= offset))]
        starts.append(tuple(start for start, _ in spans)), codes.append(tuple(code for _, code in spans))
        offset += f.data_lines
    details = {"test_fraction": test_fraction} | ({"valid_fraction": valid_fraction} if valid_fraction > 0 else {})
    return SplitPlan("fraction", names, tuple(starts), tuple(codes), details)
