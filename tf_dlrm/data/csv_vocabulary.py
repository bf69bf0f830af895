"""``encode: vocabulary`` for raw categorical csv cells: counting, numbering, lookup, the written file.

Pure Python and numpy (no TensorFlow, no FeatureSpec), so Spark executors run exactly this code.

Ids follow descending frequency over the training split, ties broken by the value's text (code point
order), so the numbering does not depend on file order, block sizes or the engine. A value counted
fewer than ``min_count`` times, and any value first seen outside the training split, maps to the
out-of-vocabulary id: ``0`` with ``oov: first`` (the default; known values are ``1..V``) or ``V`` with
``oov: last`` (known values ``0..V-1``). The table's cardinality is ``V + 1`` either way.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping

import numpy as np

OOV_FIRST = "first"
OOV_LAST = "last"
OOV_POSITIONS = (OOV_FIRST, OOV_LAST)
FILE_HEADER = "id\tcount\tvalue"


@dataclasses.dataclass(frozen=True)
class VocabularyOptions:
    """One feature's ``encode: vocabulary`` declaration (checked where it is read)."""

    min_count: int = 1
    oov: str = OOV_FIRST


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """The known values of one feature, most frequent first, with their training counts."""

    feature: str
    values: tuple[str, ...]
    counts: tuple[int, ...]
    options: VocabularyOptions

    @property
    def oov_id(self) -> int:
        return 0 if self.options.oov == OOV_FIRST else len(self.values)

    @property
    def first_id(self) -> int:
        return 1 if self.options.oov == OOV_FIRST else 0

    @property
    def cardinality(self) -> int:
        return len(self.values) + 1

    def index(self) -> dict[str, int]:
        return {value: self.first_id + position for position, value in enumerate(self.values)}

    def lookup(self, cells: Iterable[str], index: Mapping[str, int] | None = None) -> np.ndarray:
        """int64 ids of raw cells (stripped, like every engine strips them); unknown values get the OOV id."""
        index = self.index() if index is None else index
        oov = self.oov_id
        return np.array([index.get(cell.strip(), oov) for cell in cells], dtype=np.int64)

    def to_text(self) -> str:
        """The readable file: a comment line, a header, then one ``id<TAB>count<TAB>value`` line per value."""
        lines = [
            f"# vocabulary of '{self.feature}': {len(self.values)} values counted >= {self.options.min_count} times in "
            f"the train split, by descending count (ties by value); out-of-vocabulary id {self.oov_id}",
            FILE_HEADER,
        ]
        lines.extend(f"{self.first_id + position}\t{count}\t{escape(value)}"
                     for position, (value, count) in enumerate(zip(self.values, self.counts)))
        return "\n".join(lines) + "\n"


def build_vocabulary(feature: str, counts: Mapping[str, int], options: VocabularyOptions) -> Vocabulary:
    """Numbers the values counted at least ``min_count`` times: descending count, then value text."""
    kept = sorted(((value, count) for value, count in counts.items() if count >= options.min_count),
                  key=lambda item: (-item[1], item[0]))
    return Vocabulary(feature, tuple(v for v, _ in kept), tuple(int(c) for _, c in kept), options)


def count_cells(cells: Iterable[str], counts: dict[str, int]) -> None:
    """Adds the stripped cells to ``counts`` (the training pass of both engines)."""
    for cell in cells:
        value = cell.strip()
        counts[value] = counts.get(value, 0) + 1


def escape(value: str) -> str:
    """A value on one tab-separated line: backslash and tab escaped (a csv cell holds no newline)."""
    return value.replace("\\", "\\\\").replace("\t", "\\t")


def unescape(text: str) -> str:
    out, position = [], 0
    while position < len(text):
        character = text[position]
        if character == "\\" and position + 1 < len(text):
            out.append("\t" if text[position + 1] == "t" else text[position + 1])
            position += 2
        else:
            out.append(character)
            position += 1
    return "".join(out)


def read_vocabulary_file(path: str) -> dict[int, str]:
    """id -> value of a written vocabulary file (for users mapping ids back, and for tests)."""
    with open(path, "r", encoding="utf-8") as handle:
        lines = [line.rstrip("\n") for line in handle if not line.startswith("#")]
    if not lines or lines[0] != FILE_HEADER:
        raise ValueError(f"{path}: not a vocabulary file (expected the header {FILE_HEADER!r})")
    mapping = {}
    for line in lines[1:]:
        identifier, _, value = line.split("\t", 2)
        mapping[int(identifier)] = unescape(value)
    return mapping
