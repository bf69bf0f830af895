"""``preprocessing.criteo --keys=hashed``: raw int64 keys from Criteo rows, no vocabulary;
the keys follow the documented formula (checked with an independent pure-Python SplitMix64); the
Spark engine writes the same bytes (when PySpark is installed); a bad flag mix is refused."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "preprocessing"))
from criteo_reference import files_of  # noqa: E402

from preprocessing.criteo import PreprocessConfig, preprocess  # noqa: E402
from tf_dlrm.spec.feature_spec import FeatureSpec  # noqa: E402

MASK = (1 << 64) - 1


def splitmix64(word: int) -> int:
    """SplitMix64's output for state ``word`` (Vigna's reference C code, in Python integers)."""
    z = (word + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def expected_key(feature: int, field: str) -> int:
    word = (feature << 33) | (int(field, 16) if field else 1 << 32)
    key = splitmix64(word)
    return key - (1 << 64) if key >= 1 << 63 else key


def test_hashed_keys_follow_the_formula_and_load_as_a_dynamic_spec(tmp_path, criteo):
    output = tmp_path / "hashed"
    report = preprocess(PreprocessConfig(inputs=(criteo.tsv,), output_dir=str(output), keys="hashed",
                                         dynamic_capacity=5000, num_workers=1))
    assert report["keys"] == "hashed" and report["rows"] == {"train": 900, "test": 100}
    assert not (output / "vocabulary").exists()
    spec = FeatureSpec.load(str(output / "feature_spec.yaml"))
    for name in spec.categorical_features:
        assert spec.feature_spec[name] == {"dtype": "int64", "dynamic": True, "capacity": 5000, "eviction": "lru"}
    rows = [line.rstrip("\n").split("\t") for line in open(criteo.tsv, encoding="utf-8")][:900]
    with_missing = next(f for f in range(26) if any(row[14 + f] == "" for row in rows))  # a missing value is covered
    for feature in (0, 7, 25, with_missing):
        keys = np.fromfile(output / "train" / f"cat_{feature}.bin", dtype=np.int64)
        assert keys.shape == (900,)
        expected = [expected_key(feature, row[14 + feature]) for row in rows]
        assert keys.tolist() == expected


def test_capacity_comes_from_the_training_keys(tmp_path, monkeypatch, criteo):
    """Without --dynamic_capacity each table holds its distinct training keys with a quarter more, over
    all ranks: 900 training rows plan a few kilobytes, not the 26 million rows of a fixed default."""
    import math

    from preprocessing import hashed_keys

    output = tmp_path / "sized"
    preprocess(PreprocessConfig(inputs=(criteo.tsv,), output_dir=str(output), keys="hashed", num_workers=1))
    spec = FeatureSpec.load(str(output / "feature_spec.yaml"))
    rows = [line.rstrip("\n").split("\t") for line in open(criteo.tsv, encoding="utf-8")][:900]
    for feature, name in enumerate(spec.categorical_features):
        distinct = len({row[14 + feature] for row in rows})  # a missing value is one key of its own
        assert spec.feature_spec[name]["capacity"] == math.ceil(1.25 * distinct) + 64, name
        assert spec.feature_spec[name]["capacity_scope"] == "total"
    monkeypatch.setattr(hashed_keys, "MAX_COUNTED", 50)  # past it: counting stops, rows per rank
    assert hashed_keys.capacity_from_keys(str(output / "train" / "cat_2.bin")) == {"capacity": 50, "capacity_scope": "per_rank"}


def test_hashed_keys_refuse_vocabulary_flags(tmp_path, generated_criteo):
    with pytest.raises(ValueError, match="--keys=hashed builds no vocabulary: leave out --vocab_dir and --frequency_threshold"):
        PreprocessConfig(inputs=(generated_criteo.tsv,), output_dir=str(tmp_path / "x"), keys="hashed", frequency_threshold=3)
    with pytest.raises(ValueError, match="--dynamic_capacity must be > 0. Received: dynamic_capacity=0"):
        PreprocessConfig(inputs=(generated_criteo.tsv,), output_dir=str(tmp_path / "x"), keys="hashed", dynamic_capacity=0)


def test_spark_writes_the_same_hashed_bytes(tmp_path, criteo_real_or_generated):
    pytest.importorskip("pyspark", reason="the Spark engine needs PySpark")
    from preprocessing.spark_engine import make_session

    session = make_session("local[2]", conf={"spark.sql.shuffle.partitions": "2", "spark.ui.showConsoleProgress": "false"})
    try:
        for engine in ("local", "spark"):
            preprocess(PreprocessConfig(inputs=(criteo_real_or_generated.tsv,), output_dir=str(tmp_path / engine), engine=engine,
                                        keys="hashed", num_workers=1, block_bytes=16384),
                       spark=session if engine == "spark" else None)
    finally:
        session.stop()
    local, spark = files_of(str(tmp_path / "local")), files_of(str(tmp_path / "spark"))
    assert sorted(local) == sorted(spark)
    assert [name for name in local if local[name] != spark[name]] == []
