"""The Criteo rows the tests read: the real samples where present, and rows generated in their layouts.

The real samples (1,000 rows of the Criteo 1TB day 0 TSV, 200 rows of the Kaggle CSV) stay outside the
repository for their licence: in ``$TF_DLRM_CRITEO_SAMPLES``, by default ``../shared/data`` beside the
repository. A test that needs them skips with one line naming the missing file; the generated rows
below have the same layouts (label, 13 integer columns, 26 8-hex-digit hashes, empty fields for
missing values; the Kaggle CSV with its header and integers written as floats), so every code path
the samples cover also runs on a fresh clone.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = "TF_DLRM_CRITEO_SAMPLES"
TSV_NAME = "criteo_1tb_day0_sample_1k.tsv"
CSV_NAME = "criteo_kaggle_sample_200.csv"
CSV_HEADER = ",".join(["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)])


class Samples(NamedTuple):
    tsv: str  # 1,000 rows, Criteo 1TB day layout: tab-separated, no header
    csv: str  # 200 rows + header, Criteo Kaggle layout: comma-separated
    source: str  # "real" or "generated"


def samples_dir() -> str:
    return os.path.abspath(os.environ.get(ENV) or os.path.join(REPO, "..", "shared", "data"))


def missing_reason(path: str) -> str:
    """The one line a test skips with when a real sample is absent."""
    return (f"real Criteo sample not found: {path}; set {ENV}=<directory holding {TSV_NAME} and {CSV_NAME}> "
            f"(default: ../shared/data beside the repository)")


def preferred_source() -> str:
    """"real" where both real samples are present, else "generated"."""
    directory = samples_dir()
    present = all(os.path.isfile(os.path.join(directory, name)) for name in (TSV_NAME, CSV_NAME))
    return "real" if present else "generated"


def real_samples() -> Samples:
    """The real samples; skips the calling test with :func:`missing_reason` when one is absent."""
    import pytest

    directory = samples_dir()
    paths = [os.path.join(directory, TSV_NAME), os.path.join(directory, CSV_NAME)]
    for path in paths:
        if not os.path.isfile(path):
            pytest.skip(missing_reason(path))
    return Samples(paths[0], paths[1], "real")


# Per categorical feature: how many distinct hashes it draws from (a few tiny, most skewed over
# hundreds, some close to one per row) and how often it is empty (C19, C20, C22, C25, C26 are
# often empty in Criteo).
VOCABULARY_SIZES = (40, 300, 900, 600, 12, 6, 400, 60, 3, 500, 400, 900, 300, 10, 500, 900, 8, 300, 200, 4, 900,
                    6, 12, 500, 30, 400)
EMPTY_FRACTIONS = (0.0, 0.0, 0.03, 0.03, 0.0, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.03, 0.0, 0.0, 0.0, 0.03, 0.0, 0.0,
                   0.4, 0.4, 0.03, 0.75, 0.0, 0.03, 0.4, 0.4)
INTEGER_EMPTY_FRACTIONS = (0.45, 0.0, 0.2, 0.2, 0.03, 0.2, 0.04, 0.0, 0.04, 0.45, 0.04, 0.75, 0.2)
INTEGER_SCALES = (3, 100, 20, 8, 20000, 100, 10, 20, 100, 1, 3, 5, 10)


def generate_rows(num_rows: int, seed: int, positive_rate: float) -> list[list[str]]:
    """``num_rows`` rows of 40 strings: label, I1..I13 (decimal, some empty, I2 sometimes -1), C1..C26.

    The hashes are skewed (a power law over each feature's vocabulary) so frequency thresholds keep some
    and drop others; the label follows a hidden per-hash weight of C1..C3 so a model can learn it.
    """
    rng = np.random.default_rng(seed)
    vocabularies = [[format(int(v), "08x") for v in rng.choice(2**32, size, replace=False)] for size in VOCABULARY_SIZES]
    weights = [rng.normal(0, 2.0, size) for size in VOCABULARY_SIZES[:3]]
    rows, scores = [], []
    for _ in range(num_rows):
        integers = []
        for column, (empty, scale) in enumerate(zip(INTEGER_EMPTY_FRACTIONS, INTEGER_SCALES)):
            if rng.random() < empty:
                integers.append("")
            elif column == 1 and rng.random() < 0.05:
                integers.append("-1")
            else:
                integers.append(str(int(rng.exponential(scale))))
        categorical, score = [], 0.0
        for feature, (vocabulary, empty) in enumerate(zip(vocabularies, EMPTY_FRACTIONS)):
            if rng.random() < empty:
                categorical.append("")
                continue
            index = min(int(rng.pareto(1.0) * 2), len(vocabulary) - 1)
            categorical.append(vocabulary[index])
            if feature < 3:
                score += weights[feature][index]
        rows.append(["0"] + integers + categorical)
        scores.append(score + rng.normal(0, 0.5))
    threshold = np.quantile(scores, 1 - positive_rate)
    for row, score in zip(rows, scores):
        row[0] = "1" if score > threshold else "0"
    return rows


def write_tsv(path: str, num_rows: int = 1000, seed: int = 0) -> str:
    """Criteo 1TB day layout: tab-separated, no header, one row per line."""
    rows = generate_rows(num_rows, seed, positive_rate=0.05)
    with open(path, "w", newline="") as stream:
        stream.write("".join("\t".join(row) + "\n" for row in rows))
    return path


def write_csv(path: str, num_rows: int = 200, seed: int = 1) -> str:
    """Criteo Kaggle CSV layout: the header ``label,I1..I13,C1..C26``, integers other than I2 as floats
    (``260.0``), like the Kaggle sample; row 1 has an empty I1 and I3 = 260.0."""
    rows = generate_rows(num_rows, seed, positive_rate=0.25)
    for row in rows:
        row[1:14] = [value if column == 1 or not value else value + ".0" for column, value in enumerate(row[1:14])]
    rows[0][1], rows[0][2], rows[0][3] = "", "3", "260.0"
    with open(path, "w", newline="") as stream:
        stream.write(CSV_HEADER + "\n" + "".join(",".join(row) + "\n" for row in rows))
    return path


def generated_samples(directory: str) -> Samples:
    """Both layouts written into ``directory`` (a 1,000-row TSV and a 200-row CSV), deterministic."""
    return Samples(write_tsv(os.path.join(str(directory), "generated_day0_1k.tsv")),
                   write_csv(os.path.join(str(directory), "generated_kaggle_200.csv")), "generated")
