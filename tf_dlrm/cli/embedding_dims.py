"""The ``--embedding_dims`` flag (per-table widths): parsed and checked without TensorFlow."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def parse_width_mapping(text: str, flag: str = "--embedding_dims") -> dict[str, int]:
    """``"cat_0:16,cat_3:64"`` -> ``{"cat_0": 16, "cat_3": 64}``; raises naming the flag."""
    widths: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, separator, value = part.rpartition(":")
        try:
            width = int(value)
        except ValueError:
            width = 0
        if not separator or not name or width < 1:
            raise ValueError(f"Expected {flag} as name:width pairs with positive widths, e.g. cat_0:16,cat_3:64. "
                             f"Received: {part!r}")
        widths[name] = width
    return widths


def check_width_mapping(widths: Mapping[str, int], table_names: Sequence[str], flag: str = "--embedding_dims") -> None:
    unknown = sorted(set(widths) - set(table_names))
    if unknown:
        raise ValueError(f"{flag} names unknown table(s) {unknown}. Tables: {list(table_names)[:10]}")
