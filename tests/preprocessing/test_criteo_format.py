"""Row parsing and validation: hand-picked edge cases and a randomised comparison with the reference."""

from __future__ import annotations

import numpy as np
import pytest

from criteo_reference import classify, integer, read_rows
from preprocessing.criteo_format import REASONS, CriteoFormatError, InputFormat, detect_format, parse_block

TSV = InputFormat(b"\t", header=False)
GOOD = ["1"] + ["5"] * 13 + ["0a1b2c3d"] * 26


def row_with(column: int, value: str) -> list[str]:
    row = list(GOOD)
    row[column] = value
    return row


def parse(rows, input_format=TSV):
    delimiter = input_format.delimiter.decode()
    return parse_block("".join(delimiter.join(row) + "\n" for row in rows).encode(), input_format)


@pytest.mark.parametrize(
    "value, expected",
    [
        ("0", 0), ("7", 7), ("12345678", 12345678), ("123456789", 123456789), ("-1", 0), ("-0", 0), ("", 0),
        ("260.0", 260), ("260.", 260), ("10.000", 10), ("-3.0", 0), ("999999999999999999", 999999999999999999),
        ("00042", 42),
    ],
)
def test_integers_accepted(value, expected):
    parsed = parse([row_with(3, value)])
    assert parsed.valid.tolist() == [True]
    assert parsed.integers[0, 2] == expected


@pytest.mark.parametrize(
    "value", ["12ab", "1.5", ".0", "-", "--1", "1-", "1e5", "1.0.0", " 1", "1 ", "+1", "1234567890123456789", "٣"]
)
def test_integers_rejected(value):
    parsed = parse([row_with(3, value)])
    assert [REASONS[r] for r in parsed.reason] == ["bad_integer"]
    assert "column I3" in parsed.describe(0)


@pytest.mark.parametrize("value, expected", [("0", 0), ("1", 1), ("1.0", 1), ("0.", 0)])
def test_labels_accepted(value, expected):
    parsed = parse([row_with(0, value)])
    assert parsed.label.tolist() == [expected]


@pytest.mark.parametrize("value", ["2", "-1", "", "x", "0.5", "-0"])
def test_labels_rejected(value):
    assert [REASONS[r] for r in parse([row_with(0, value)]).reason] == ["bad_label"]


@pytest.mark.parametrize("value, expected", [("", -1), ("00000000", 0), ("ffffffff", 2**32 - 1), ("DeadBeef", 0xDEADBEEF)])
def test_hashes_accepted(value, expected):
    parsed = parse([row_with(20, value)])
    assert parsed.categorical[0, 6] == expected


@pytest.mark.parametrize("value", ["0a1b2c3", "0a1b2c3d4", "0a1b2c3g", "0a1b 2c3", "0x1b2c3d", "é1b2c3d"])
def test_hashes_rejected(value):
    parsed = parse([row_with(20, value)])
    assert [REASONS[r] for r in parsed.reason] == ["bad_categorical"]
    assert "column C7" in parsed.describe(0)


def test_field_counts_and_first_bad_column_wins():
    rows = [GOOD[:39], GOOD + ["x"], [""], row_with(1, "x")[:20] + ["zz"] * 20, GOOD]
    parsed = parse(rows)
    assert [REASONS[r] if r >= 0 else None for r in parsed.reason] == [
        "wrong_field_count", "wrong_field_count", "wrong_field_count", "bad_integer", None
    ]
    assert parsed.describe(0) == "39 fields, expected 40"
    assert parsed.describe(3) == "column I1: 'x'"
    assert parsed.label.shape == (1,)


def test_csv_and_carriage_returns():
    csv = InputFormat(b",", header=True)
    parsed = parse_block(("\r\n".join(",".join(r) for r in [GOOD, row_with(2, "3.0")]) + "\r\n").encode().replace(b"\r\n", b"\n"), csv)
    assert parsed.valid.tolist() == [True, True]
    assert parsed.integers[1, 1] == 3


def test_randomised_fields_match_the_reference():
    """Random rows mixing valid and invalid fields: every row's reason and values match the reference."""
    generator = np.random.default_rng(7)
    alphabet = list("0123456789") * 4 + list("-.abcdefABCDEFgx ")
    rows = []
    for _ in range(3000):
        count = 40 if generator.random() < 0.97 else int(generator.integers(1, 45))
        row = []
        for column in range(count):
            kind = generator.random()
            if column == 0:
                value = str(generator.integers(0, 2)) if kind < 0.98 else "".join(generator.choice(alphabet, 2))
            elif column < 14:
                if kind < 0.7:
                    value = str(int(generator.integers(-5, 10 ** int(generator.integers(1, 19)))))
                elif kind < 0.8:
                    value = ""
                elif kind < 0.99:
                    value = f"{generator.integers(0, 10**6)}.{'0' * int(generator.integers(0, 4))}"
                else:
                    value = "".join(generator.choice(alphabet, int(generator.integers(1, 21))))
            else:
                if kind < 0.8:
                    value = format(int(generator.integers(0, 2**32)), "08x")
                elif kind < 0.99:
                    value = ""
                else:
                    value = "".join(generator.choice(list("0123456789abcdefABCDEFg"), int(generator.integers(1, 11))))
            row.append(value)
        rows.append(row)
    parsed = parse(rows)
    expected_reasons = [classify(row) for row in rows]
    assert [REASONS[r] if r >= 0 else None for r in parsed.reason] == expected_reasons
    valid_rows = [row for row, reason in zip(rows, expected_reasons) if reason is None]
    assert 1000 < len(valid_rows) < 2900  # both kinds are well represented
    np.testing.assert_array_equal(parsed.label, [int(float(row[0])) for row in valid_rows])
    np.testing.assert_array_equal(parsed.integers, [[integer(v) for v in row[1:14]] for row in valid_rows])
    np.testing.assert_array_equal(parsed.categorical, [[int(v, 16) if v else -1 for v in row[14:]] for row in valid_rows])


@pytest.mark.parametrize("layout", ["tsv", "csv"])
def test_detect_format_of_the_samples(criteo, layout):
    sample = getattr(criteo, layout)
    with open(sample, "rb") as stream:
        lines = stream.read().split(b"\n")[:101]
    detected = detect_format(sample, lines)
    rows, header = read_rows(sample)
    assert detected.header == header
    assert detected.name == ("csv" if header else "tsv")


def test_detect_format_tolerates_a_bad_first_row_but_not_a_file_of_them():
    good = "\t".join(GOOD).encode()
    assert detect_format("x", [b"1\t2", good]).name == "tsv"
    with pytest.raises(CriteoFormatError, match="x: not Criteo-shaped: none of the first 2 data lines"):
        detect_format("x", [b"1\t2", b"0\t3"])
