"""An independent, deliberately plain reference of the Criteo preprocessing, for tests.

Row by row with the csv module, regular expressions, collections.Counter and math.log1p: none of
the vectorised code under test. Tests compare the engines' files with what this computes.
"""

from __future__ import annotations

import collections
import csv
import gzip
import io
import math
import os
import re
import shutil

import numpy as np

INTEGER = re.compile(r"^-?[0-9]+(\.0*)?$")  # a digit before an optional all-zero fraction
HASH = re.compile(r"^[0-9a-fA-F]{8}$")


def read_rows(path: str) -> tuple[list[list[str]], bool]:
    """All data rows as lists of strings (header dropped) and whether there was a header."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as stream:
        text = stream.read()
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    delimiter = "\t" if "\t" in text.split("\n", 1)[0] else ","
    rows = list(csv.reader(io.StringIO(text), delimiter=delimiter, quoting=csv.QUOTE_NONE))
    header = bool(rows) and rows[0][0] == "label"
    return (rows[1:] if header else rows), header


def classify(row: list[str]) -> str | None:
    """The bad-row reason of a row, None when valid."""
    if len(row) != 40:
        return "wrong_field_count"
    if not INTEGER.match(row[0]) or row[0].startswith("-") or float(row[0]) not in (0.0, 1.0):
        return "bad_label"
    for value in row[1:14]:
        if value and (not INTEGER.match(value) or len(value) > 18):
            return "bad_integer"
    for value in row[14:]:
        if value and not HASH.match(value):
            return "bad_categorical"
    return None


def integer(value: str) -> int:
    return max(int(value.split(".")[0]), 0) if value else 0


class Reference:
    """The expected dataset of ``rows`` (in input order) with ``split_of(global_line)``."""

    def __init__(self, rows: list[list[str]], split_of, frequency_threshold: int):
        self.valid = [(number, row) for number, row in enumerate(rows) if classify(row) is None]
        self.reasons = collections.Counter(classify(row) for row in rows if classify(row) is not None)
        self.split_of = split_of
        self.counts = [collections.Counter() for _ in range(26)]
        for number, row in self.valid:
            if split_of(number) == "train":
                for feature, value in enumerate(row[14:]):
                    if value:
                        self.counts[feature][int(value, 16)] += 1
        self.ids = []
        for counter in self.counts:
            kept = sorted((-count, value) for value, count in counter.items() if count >= frequency_threshold)
            self.ids.append({value: index + 2 for index, (_, value) in enumerate(kept)})
        self.cardinalities = [2 + len(ids) for ids in self.ids]

    def split(self, name: str) -> dict[str, np.ndarray]:
        rows = [row for number, row in self.valid if self.split_of(number) == name]
        return {
            "label": np.array([int(float(row[0])) for row in rows], dtype=np.uint8),
            "numerical": np.array([[math.log1p(integer(v)) for v in row[1:14]] for row in rows], dtype=np.float64)
            .astype(np.float16)
            .reshape(-1, 13),
            "categorical": [
                np.array([self.ids[f].get(int(row[14 + f], 16), 1) if row[14 + f] else 0 for row in rows], dtype=np.int64)
                for f in range(26)
            ],
        }


def read_split(output_dir: str, split: str, cardinalities) -> dict[str, np.ndarray]:
    from tf_dlrm.spec.format import categorical_dtype_for

    base = os.path.join(output_dir, split)
    return {
        "label": np.fromfile(os.path.join(base, "label.bin"), dtype=np.uint8),
        "numerical": np.fromfile(os.path.join(base, "numerical.bin"), dtype=np.float16).reshape(-1, 13),
        "categorical": [
            np.fromfile(os.path.join(base, f"cat_{i}.bin"), dtype=categorical_dtype_for(c)).astype(np.int64)
            for i, c in enumerate(cardinalities)
        ],
    }


def assert_split_equal(actual: dict, expected: dict, where: str) -> None:
    np.testing.assert_array_equal(actual["label"], expected["label"], err_msg=f"{where}: label")
    np.testing.assert_array_equal(
        actual["numerical"].view(np.uint16), expected["numerical"].view(np.uint16), err_msg=f"{where}: numerical"
    )
    for index, (got, want) in enumerate(zip(actual["categorical"], expected["categorical"])):
        np.testing.assert_array_equal(got, want, err_msg=f"{where}: cat_{index}")


def fraction_split(num_lines: int, test_fraction: float):
    boundary = num_lines - int(math.floor(num_lines * test_fraction + 0.5))
    return lambda number: "train" if number < boundary else "test"


def corrupt_copy(source: str, target: str) -> dict[str, list[int]]:
    """Writes a corrupted copy of a 1,000-row TSV sample (real or generated); returns the 1-based bad line numbers per reason.

    Corruptions: a truncated row (line 10), letters in an integer column (line 20, I3 = '12ab'), a
    9-character hash (line 30, C5), a label '2' (line 40), an empty line (line 50), another
    truncated row in the test part (line 995).
    """
    with open(source, "r", newline="") as stream:
        lines = stream.read().split("\n")
    def fields(number):
        return lines[number - 1].split("\t")
    row = fields(10)
    lines[9] = "\t".join(row[:35])
    row = fields(20)
    row[3] = "12ab"
    lines[19] = "\t".join(row)
    row = fields(30)
    row[18] = "012345678"  # 9 characters
    lines[29] = "\t".join(row)
    row = fields(40)
    row[0] = "2"
    lines[39] = "\t".join(row)
    lines[49] = ""
    row = fields(995)
    lines[994] = "\t".join(row[:39])
    with open(target, "w", newline="") as stream:
        stream.write("\n".join(lines))
    return {
        "wrong_field_count": [10, 50, 995],
        "bad_label": [40],
        "bad_integer": [20],
        "bad_categorical": [30],
    }


def copy_days(source: str, directory: str, layout: dict[str, tuple[int, int]], gzip_names=()) -> list[str]:
    """Cuts ``source`` into day files: ``{name: (first line, end line)}`` (0-based, end exclusive)."""
    with open(source, "rb") as stream:
        lines = stream.read().split(b"\n")
    paths = []
    for name, (begin, end) in layout.items():
        path = os.path.join(directory, name + (".gz" if name in gzip_names else ""))
        data = b"\n".join(lines[begin:end]) + b"\n"
        if name in gzip_names:
            with gzip.open(path, "wb") as stream:
                stream.write(data)
        else:
            with open(path, "wb") as stream:
                stream.write(data)
        paths.append(path)
    return paths


def files_of(directory: str) -> dict[str, bytes]:
    """Every file under ``directory`` by relative path, with its bytes."""
    result = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as stream:
                result[os.path.relpath(path, directory)] = stream.read()
    return result


def copy(source: str, target: str) -> str:
    shutil.copyfile(source, target)
    return target
