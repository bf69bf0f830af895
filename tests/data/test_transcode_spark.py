"""The Spark engine of the csv transcoder writes the same bytes as the local engine (files, vocabularies, spec)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("pyspark", reason="the Spark engine needs PySpark: make install-spark")

from raw_csv import write_dataset  # noqa: E402
from tf_dlrm.data.csv_values import TranscodeError  # noqa: E402
from tf_dlrm.data.transcode import transcode


@pytest.fixture(scope="module")
def engine():
    from tf_dlrm.data.transcode_spark import SparkEngine, make_session

    session = make_session("local[2]", conf={"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2",
                                              "spark.ui.showConsoleProgress": "false", "spark.driver.memory": "1g"})
    yield SparkEngine(session, min_partitions=3, block_lines=97)
    session.stop()


def files_of(directory):
    found = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as handle:
                found[os.path.relpath(path, directory)] = handle.read()
    return found


def assert_identical(tmp_path):
    local, spark = files_of(tmp_path / "local"), files_of(tmp_path / "spark")
    assert sorted(local) == sorted(spark)
    assert [name for name in local if local[name] != spark[name]] == []
    return local


@pytest.mark.parametrize("dynamic", [False, True], ids=["vocabulary_fixed_tables", "hash_dynamic_tables"])
def test_local_and_spark_write_identical_bytes(tmp_path, engine, dynamic):
    spec_path = write_dataset(tmp_path, rows=3000, dynamic=dynamic, train_files=2)
    transcode(spec_path, str(tmp_path / "local"), block_lines=256)
    transcode(spec_path, str(tmp_path / "spark"), engine=engine)
    files = assert_identical(tmp_path)
    assert engine.context.textFile(str(tmp_path / "train0.csv"), 3).getNumPartitions() >= 2  # really split
    expected = {"feature_spec.yaml", "train/label.bin", "train/numerical.bin", "test/label.bin"}
    if not dynamic:
        expected |= {f"vocabularies/{name}.tsv" for name in ("cat_0_city", "cat_1_url", "cat_2_device")}
    assert expected <= set(files), sorted(files)


@pytest.mark.parametrize("edit, message", [
    (lambda cells: cells[:1] + ["cheap"] + cells[2:], "train0.csv, line 451: column 2 ('price'): 'cheap' is not a number"),
    (lambda cells: cells[:-1], "train0.csv, line 451: expected 6 columns separated by ','"),  # fails in the counting pass
], ids=["bad_number", "missing_column"])
def test_spark_reports_a_bad_line_like_the_local_engine(tmp_path, engine, edit, message):
    spec_path = write_dataset(tmp_path, rows=600)
    lines = (tmp_path / "train0.csv").read_text().splitlines()
    lines[450] = ",".join(edit(lines[450].split(",")))
    (tmp_path / "train0.csv").write_text("\n".join(lines) + "\n")
    messages = []
    for output, settings in (("local", {}), ("spark", {"engine": engine})):
        with pytest.raises(TranscodeError) as raised:
            transcode(spec_path, str(tmp_path / output), **settings)
        messages.append(str(raised.value))
        assert not (tmp_path / output).exists()
    assert messages[0] == messages[1]
    assert message in messages[1]


def test_parquet_row_groups_on_spark_write_the_local_bytes(tmp_path, engine):
    """One task per row group (several per file), rows named from the file's start."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    import numpy as np
    import yaml

    rng = np.random.default_rng(4)
    cities = ["paris", "lyon", None, "nice"]

    def write(path, rows, bad_row=None):
        price = rng.exponential(20, rows)
        if bad_row is not None:
            price[bad_row] = -1.0  # log1p of a negative value
        table = pa.table({"clicked": rng.integers(0, 2, rows), "price": price,
                          "city": [cities[i] for i in rng.integers(0, 4, rows)],
                          "tags": [[int(t) for t in rng.integers(0, 20, 2)] for _ in range(rows)]})
        pq.write_table(table, path, row_group_size=37)

    write(tmp_path / "train0.parquet", 200)
    write(tmp_path / "train1.parquet", 90)
    write(tmp_path / "test.parquet", 50)
    chunk = {"type": "parquet", "features": ["clicked", "price", "city", "tags"], "encode": {"city": "vocabulary"},
             "transform": {"price": "log1p"}}
    raw = {"feature_spec": {"clicked": {"dtype": "bool"}, "price": {"dtype": "float32"}, "city": {"dtype": "int32"},
                            "tags": {"dtype": "int32", "cardinality": 20, "hotness": 2}},
           "channel_spec": {"label": ["clicked"], "numerical": ["price"], "categorical": ["city", "tags"]},
           "source_spec": {"train": [dict(chunk, files=["train0.parquet", "train1.parquet"])],
                           "test": [dict(chunk, files=["test.parquet"])]}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(raw))
    transcode(str(tmp_path / "spec.yaml"), str(tmp_path / "local"), block_lines=16)
    transcode(str(tmp_path / "spec.yaml"), str(tmp_path / "spark"), engine=engine)
    files = assert_identical(tmp_path)
    assert len(files["train/label.bin"]) == 290 and "vocabularies/cat_0_city.tsv" in files
    write(tmp_path / "train1.parquet", 90, bad_row=80)  # in the file's third row group
    with pytest.raises(TranscodeError, match=r"train1.parquet, row 80: column 'price': log1p of the negative value"):
        transcode(str(tmp_path / "spec.yaml"), str(tmp_path / "spark_bad"), engine=engine)
