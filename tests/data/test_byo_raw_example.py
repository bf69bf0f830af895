"""feature_specs/byo_raw_example (the README's walk-through): reproducible, and both of its specs transcode."""

from __future__ import annotations

import importlib.util
import os

import numpy as np

from tf_dlrm.data.csv_vocabulary import read_vocabulary_file
from tf_dlrm.data.csv_values import hash_key
from tf_dlrm.data.transcode import transcode

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPOSITORY, "feature_specs", "byo_raw_example")


def test_checked_in_csvs_are_what_the_generator_makes(tmp_path):
    spec = importlib.util.spec_from_file_location("make_raw_example", os.path.join(EXAMPLE, "make_raw_example.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.build(str(tmp_path))
    for name in ("train.csv", "test.csv"):
        with open(os.path.join(EXAMPLE, name), "rb") as checked_in, open(tmp_path / name, "rb") as regenerated:
            assert checked_in.read() == regenerated.read(), f"{name} is stale: run {EXAMPLE}/make_raw_example.py"


def test_both_specs_transcode_the_raw_strings(tmp_path):
    fixed = transcode(os.path.join(EXAMPLE, "feature_spec.yaml"), str(tmp_path / "fixed"))
    hashed = transcode(os.path.join(EXAMPLE, "feature_spec_hashed.yaml"), str(tmp_path / "hashed"))
    assert fixed.metadata["num_samples"] == hashed.metadata["num_samples"] == {"train": 4000, "test": 1000}
    cities = [line.split(",")[3] for line in open(os.path.join(EXAMPLE, "test.csv")).read().splitlines()[1:]]
    names = read_vocabulary_file(str(tmp_path / "fixed" / fixed.feature_spec["city"]["vocabulary"]))
    ids = np.fromfile(fixed.split_files("test").categorical[0], dtype=fixed.dtype("city"))
    assert [names[i] for i in ids.tolist()] == cities
    keys = np.fromfile(hashed.split_files("test").categorical[0], dtype=np.int64)
    assert keys.tolist() == [hash_key("city", c) for c in cities]
    assert fixed.feature_spec["url"]["cardinality"] - 1 < len(set(
        line.split(",")[4] for line in open(os.path.join(EXAMPLE, "train.csv")).read().splitlines()[1:]))  # min_count 2
