"""Counting bad rows per reason, keeping the first few, and the ``--strict`` error."""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

from preprocessing.criteo_format import REASONS, BadRowError, ParsedBlock

FIRST_KEPT = 10  # bad rows listed per reason in preprocess_report.json


@dataclasses.dataclass(frozen=True, order=True)
class BadRow:
    file_index: int
    line: int  # 1-based line number in the file
    reason: str
    detail: str


@dataclasses.dataclass
class BadRowTally:
    """Counts per reason and the first :data:`FIRST_KEPT` rows per reason, in file/line order.

    Merging is order-independent (counts add, first rows are re-sorted), so the local engine's
    blocks and Spark's partitions give the same tally.
    """

    counts: dict[str, int] = dataclasses.field(default_factory=lambda: {reason: 0 for reason in REASONS})
    first: dict[str, list[BadRow]] = dataclasses.field(default_factory=lambda: {reason: [] for reason in REASONS})

    def add_block(self, parsed: ParsedBlock, file_index: int, first_line_number: int, rows=None) -> None:
        """Tallies the bad rows of a parsed block (optionally only where ``rows`` is True)."""
        bad = ~parsed.valid if rows is None else (~parsed.valid & rows)
        if not bad.any():
            return
        reasons = parsed.reason[bad]
        for code, reason in enumerate(REASONS):
            count = int((reasons == code).sum())
            if not count:
                continue
            self.counts[reason] += count
            room = FIRST_KEPT - len(self.first[reason])
            if room > 0:
                chosen = (parsed.reason == code) & bad
                for row, _, detail in parsed.bad_rows(room, rows=chosen):
                    self.first[reason].append(BadRow(file_index, first_line_number + row, reason, detail))

    def merge(self, other: "BadRowTally") -> None:
        for reason in REASONS:
            self.counts[reason] += other.counts[reason]
            self.first[reason] = sorted(self.first[reason] + other.first[reason])[:FIRST_KEPT]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def earliest(self) -> BadRow | None:
        rows = [row for rows in self.first.values() for row in rows]
        return min(rows) if rows else None

    def to_json(self, paths: Sequence[str]) -> dict:
        return {
            "total": self.total,
            "by_reason": {
                reason: {
                    "count": self.counts[reason],
                    "first": [{"file": paths[r.file_index], "line": r.line, "detail": r.detail} for r in self.first[reason]],
                }
                for reason in REASONS
            },
        }


def merge_tallies(tallies: Iterable[BadRowTally]) -> BadRowTally:
    result = BadRowTally()
    for tally in tallies:
        result.merge(tally)
    return result


def strict_error(row: BadRow, paths: Sequence[str]) -> BadRowError:
    return BadRowError(
        f"{paths[row.file_index]}:{row.line}: {row.reason}: {row.detail} "
        f"(--strict stops at the first bad row; without it bad rows are skipped and counted in preprocess_report.json)"
    )
