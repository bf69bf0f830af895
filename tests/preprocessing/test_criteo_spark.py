"""The Spark engine writes the same bytes as the local engine (files, spec, vocabulary, report)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("pyspark", reason="the Spark engine needs PySpark: TF_DLRM_EXTRAS=test,spark bash scripts/install.sh")

from criteo_reference import copy_days, corrupt_copy, files_of  # noqa: E402
from preprocessing.criteo import PreprocessConfig, preprocess  # noqa: E402
from preprocessing.criteo_format import BadRowError  # noqa: E402


@pytest.fixture(scope="module")
def spark():
    from preprocessing.spark_engine import make_session

    session = make_session(
        "local[2]",
        conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.ui.showConsoleProgress": "false",
            "spark.driver.memory": "1g",
        },
    )
    yield session
    session.stop()


def run_both(tmp_path, spark, inputs, **settings):
    local = preprocess(
        PreprocessConfig(inputs=tuple(inputs), output_dir=str(tmp_path / "local"), engine="local", num_workers=2,
                         block_bytes=16384, **settings)
    )
    distributed = preprocess(
        PreprocessConfig(inputs=tuple(inputs), output_dir=str(tmp_path / "spark"), engine="spark", block_bytes=10000,
                         **settings),
        spark=spark,
    )
    return local, distributed


def assert_identical(tmp_path):
    local = files_of(str(tmp_path / "local"))
    distributed = files_of(str(tmp_path / "spark"))
    assert sorted(local) == sorted(distributed)
    assert [name for name in local if local[name] != distributed[name]] == []
    return local


@pytest.mark.parametrize(
    "layout, settings",
    [("tsv", {"frequency_threshold": 3}), ("csv", {"frequency_threshold": 2, "test_fraction": 0.25}),
     ("csv", {"frequency_threshold": 2, "test_fraction": 0.2, "valid_fraction": 0.15})],
    ids=["tsv_1tb", "csv_kaggle", "csv_three_splits"],
)
def test_identical_bytes_on_the_samples(tmp_path, spark, criteo_real_or_generated, layout, settings):
    local, distributed = run_both(tmp_path, spark, [getattr(criteo_real_or_generated, layout)], **settings)
    assert local == distributed
    files = assert_identical(tmp_path)
    assert "feature_spec.yaml" in files and "vocabulary/manifest.json" in files and "train/cat_25.bin" in files


def test_identical_bytes_for_days_gzip_and_several_partitions(tmp_path, spark, criteo_real_or_generated):
    layout = {"day_0": (0, 400), "day_1": (400, 750), "day_23": (750, 1000)}
    paths = copy_days(criteo_real_or_generated.tsv, str(tmp_path), layout, gzip_names=("day_23",))
    local, distributed = run_both(tmp_path, spark, paths, frequency_threshold=2, split="days")
    assert local["rows"] == {"train": 750, "test": 125, "validation": 125}
    assert local == distributed
    assert_identical(tmp_path)


def test_identical_bad_row_reports(tmp_path, spark, criteo_real_or_generated):
    corrupted = str(tmp_path / "corrupted.tsv")
    corrupt_copy(criteo_real_or_generated.tsv, corrupted)
    local, distributed = run_both(tmp_path, spark, [corrupted], frequency_threshold=2)
    assert local["bad_rows"]["total"] == 6
    assert local == distributed
    assert_identical(tmp_path)


def test_identical_strict_errors(tmp_path, spark, generated_criteo):
    corrupted = str(tmp_path / "corrupted.tsv")
    corrupt_copy(generated_criteo.tsv, corrupted)
    messages = []
    for engine in ("local", "spark"):
        with pytest.raises(BadRowError) as error:
            preprocess(
                PreprocessConfig(inputs=(corrupted,), output_dir=str(tmp_path / engine), engine=engine, strict=True),
                spark=spark if engine == "spark" else None,
            )
        messages.append(str(error.value))
        assert not os.path.exists(tmp_path / engine)
    assert messages[0] == messages[1]
    assert messages[0].startswith(f"{corrupted}:10: wrong_field_count")


def test_identical_bytes_for_csv_with_headers_gzipped_and_plain(tmp_path, spark, criteo_real_or_generated):
    """Two CSV inputs, each with its header line; the first gzipped (one partition)."""
    import gzip
    import shutil

    with open(criteo_real_or_generated.csv, "rb") as source, gzip.open(tmp_path / "part_0.csv.gz", "wb") as target:
        shutil.copyfileobj(source, target)
    shutil.copyfile(criteo_real_or_generated.csv, tmp_path / "part_1.csv")
    inputs = [str(tmp_path / "part_0.csv.gz"), str(tmp_path / "part_1.csv")]
    local, distributed = run_both(tmp_path, spark, inputs, frequency_threshold=2, test_fraction=0.3)
    assert [f["data_lines"] for f in local["inputs"]] == [200, 200]
    assert local["rows"] == {"train": 280, "test": 120}
    assert local == distributed
    assert_identical(tmp_path)
