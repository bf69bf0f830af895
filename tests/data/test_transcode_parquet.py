"""Parquet chunks of the transcoder: files written by pandas and by pyarrow's own writer (row groups, nulls,
string and list columns) transcode to the same bytes as the same data as csv; bad files are named."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pd = pytest.importorskip("pandas")

from tf_dlrm.data.csv_values import TranscodeError  # noqa: E402
from tf_dlrm.data.transcode import transcode  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The csv column order; the Parquet files hold the same columns in another order, "extra" unused.
COLUMNS = ["click", "dense_a", "dense_b", "site", "city", "tags", "extra"]
HOTNESS, TAGS = 3, 50


def _data(rng, count: int) -> dict:
    """Columns as a pipeline holds them: ints, float64s, strings with missing values (None), lists of ids."""
    cities = np.array(["paris", "lyon", "nice", "brest", "metz"])
    return {
        "click": rng.integers(0, 2, count),
        "dense_a": rng.normal(size=count) * 50,
        "dense_b": rng.exponential(3, count),
        "site": rng.integers(0, 4, count),
        "city": [None if rng.random() < 0.2 else str(rng.choice(cities)) for _ in range(count)],
        "tags": [[int(t) for t in rng.integers(0, TAGS, HOTNESS)] for _ in range(count)],
        "extra": ["junk"] * count,
    }


def _csv_cell(value) -> str:
    if value is None:
        return ""  # an empty cell: what a null is
    if isinstance(value, list):
        return "|".join(str(v) for v in value)
    if isinstance(value, (float, np.floating)):
        return repr(float(value))
    return str(value)


def _write_csv(path, data: dict) -> None:
    rows = zip(*(data[name] for name in COLUMNS))
    path.write_text("".join(",".join(_csv_cell(v) for v in row) + "\n" for row in rows))


def _write_pandas(path, data: dict) -> None:
    frame = pd.DataFrame({name: data[name] for name in reversed(COLUMNS)})  # by name: any column order
    frame.to_parquet(path, index=False)


def _write_pyarrow(path, data: dict, row_group_size: int = 7) -> None:
    """pyarrow's own writer, several row groups, dictionary-encoded strings, a large_list column."""
    table = pa.table({
        "tags": pa.array(data["tags"], pa.large_list(pa.int32())),
        "city": pa.array(data["city"], pa.string()).dictionary_encode(),
        "click": pa.array(data["click"], pa.int8()),
        "site": pa.array(data["site"], pa.int64()),
        "dense_a": pa.array(data["dense_a"], pa.float64()),
        "dense_b": pa.array(data["dense_b"], pa.float64()),
        "extra": pa.array(data["extra"]),
    })
    with pq.ParquetWriter(path, table.schema) as writer:
        for start in range(0, table.num_rows, row_group_size * 2):
            writer.write_table(table.slice(start, row_group_size * 2), row_group_size=row_group_size)
    assert pq.ParquetFile(path).metadata.num_row_groups > 2


def _spec(kind: str, files: dict) -> dict:
    return {
        "feature_spec": {
            "click": {"dtype": "int8"}, "dense_a": {"dtype": "float32"}, "dense_b": {"dtype": "float32"},
            "site": {"dtype": "int64", "cardinality": 4}, "city": {"dtype": "int64"},
            "tags": {"dtype": "int64", "cardinality": TAGS, "hotness": HOTNESS, "combiner": "mean"},
            "extra": {"dtype": "float32"},
        },
        "channel_spec": {"label": ["click"], "numerical": ["dense_a", "dense_b"], "categorical": ["site", "city", "tags"]},
        "source_spec": {split: [{"type": kind, "features": list(COLUMNS), "files": names,
                                 "encode": {"city": {"type": "vocabulary", "min_count": 2}},
                                 "transform": {"dense_b": "log1p"}}] for split, names in files.items()},
    }


def _transcode(directory, kind: str, files: dict, block_lines: int = 5):
    path = directory / f"{kind}.yaml"
    path.write_text(yaml.safe_dump(_spec(kind, files)))
    return transcode(str(path), str(directory / f"out_{kind}"), block_lines=block_lines)


def _listing(directory) -> dict:
    return {os.path.relpath(os.path.join(root, name), directory): open(os.path.join(root, name), "rb").read()
            for root, _, names in os.walk(directory) for name in names if name != "feature_spec.yaml"}


def _written_spec(directory) -> dict:
    raw = yaml.safe_load(open(os.path.join(directory, "feature_spec.yaml")))
    del raw["metadata"]["transcoded_from"]
    return raw


@pytest.mark.parametrize("writer", [_write_pandas, _write_pyarrow], ids=["pandas", "pyarrow_row_groups"])
def test_parquet_transcodes_to_the_bytes_of_the_same_csv(tmp_path, writer):
    rng = np.random.default_rng(5)
    parts = {"train": [_data(rng, 40), _data(rng, 23)], "test": [_data(rng, 17)]}
    csv_files, parquet_files = {}, {}
    for split, datas in parts.items():
        for index, data in enumerate(datas):
            _write_csv(tmp_path / f"{split}_{index}.csv", data)
            writer(tmp_path / f"{split}_{index}.parquet", data)
            csv_files.setdefault(split, []).append(f"{split}_{index}.csv")
            parquet_files.setdefault(split, []).append(f"{split}_{index}.parquet")
    _transcode(tmp_path, "csv", csv_files)
    written = _transcode(tmp_path, "parquet", parquet_files)
    from_csv, from_parquet = _listing(tmp_path / "out_csv"), _listing(tmp_path / "out_parquet")
    assert sorted(from_parquet) == sorted(from_csv) and "vocabularies/cat_1_city.tsv" in from_parquet
    for name in from_csv:
        assert from_parquet[name] == from_csv[name], name
    assert _written_spec(tmp_path / "out_parquet") == _written_spec(tmp_path / "out_csv")
    # The bytes hold the data (not merely the same mistake twice): labels, multi-hot ids, the null's id.
    train = [parts["train"][0], parts["train"][1]]
    labels = np.fromfile(tmp_path / "out_parquet" / "train" / "label.bin", np.bool_)
    np.testing.assert_array_equal(labels, np.concatenate([d["click"] for d in train]).astype(bool))
    tags = np.fromfile(tmp_path / "out_parquet" / "train" / "cat_2_tags.bin", np.int8).reshape(-1, HOTNESS)
    np.testing.assert_array_equal(tags, [t for d in train for t in d["tags"]])
    assert written.feature_spec["city"]["cardinality"] == 7  # 5 cities, the empty value (nulls), the OOV id
    vocabulary = (tmp_path / "out_parquet" / "vocabularies" / "cat_1_city.tsv").read_text().splitlines()
    nulls = sum(city is None for d in train for city in d["city"])
    assert any(line.split("\t")[1:] == [str(nulls), ""] for line in vocabulary), vocabulary


def _bad(tmp_path, column, values, kind="pandas"):
    rng = np.random.default_rng(1)
    data = _data(rng, 12)
    data[column] = values
    path = tmp_path / "bad.parquet"
    if kind == "pandas":
        _write_pandas(path, data)
    else:
        pq.write_table(pa.table({name: pa.array(data[name]) for name in COLUMNS if name in data}), path)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(_spec("parquet", {"train": ["bad.parquet"]})))
    with pytest.raises(TranscodeError) as caught:
        transcode(str(tmp_path / "spec.yaml"), str(tmp_path / "out"), block_lines=5)
    assert not os.path.exists(tmp_path / "out")
    message = str(caught.value)
    assert "\n" not in message
    return message.replace(str(path), "FILE")


def test_bad_parquet_columns_are_named_with_file_column_and_row(tmp_path):
    missing = tmp_path / "missing"
    missing.mkdir()
    rng = np.random.default_rng(1)
    data = _data(rng, 12)
    del data["site"]
    pq.write_table(pa.table({name: pa.array(value) for name, value in data.items()}), missing / "bad.parquet")
    (missing / "spec.yaml").write_text(yaml.safe_dump(_spec("parquet", {"train": ["bad.parquet"]})))
    with pytest.raises(TranscodeError, match=r"bad.parquet: no column 'site' \(a feature of the chunk\). The file's "
                                             r"columns: \['click', 'dense_a'"):
        transcode(str(missing / "spec.yaml"), str(missing / "out"))
    ids_with_a_gap = [1, 2, None, 3] * 3  # pandas stores these as float64 with a null
    cases = {
        "float_ids": ("site", ids_with_a_gap, "FILE: column 'site' has Parquet type double; expected integer ids "
                      "(integers or strings, or lists of them for a multi-hot feature) (pandas writes an integer "
                      "column holding missing values as float64: fill them, or use the nullable 'Int64' dtype)"),
        "nullable_int_null": ("site", pd.array(ids_with_a_gap, dtype="Int64"), "FILE, row 2, column 'site': the value is null; "
                              "expected an id"),
        "text_in_numbers": ("dense_a", ["1.5"] * 7 + ["abc"] + ["2"] * 4, "FILE, row 7: column 'dense_a': 'abc' is not a number"),
        "list_for_numbers": ("dense_a", [[1.0]] * 12, "FILE: column 'dense_a' has Parquet type list<element: double>; "
                             "expected numbers"),
        "short_list": ("tags", [[1, 2, 3]] * 6 + [[4, 5]] + [[1, 2, 3]] * 5, "FILE, row 6: column 'tags': 2 ids in '4|5', "
                       "fewer than the feature's hotness 3"),
        # A null list: named as null, not as csv's empty cell "1 ids in ''" with advice about '|' separators.
        "null_list": ("tags", [[1, 2, 3]] * 9 + [None] + [[1, 2, 3]] * 2, "FILE, row 9, column 'tags': the list is null; "
                      "expected a list of exactly 3 ids (hotness 3; a variable-length feature, ragged: true, would read a "
                      "null list as no ids)"),
        "id_outside": ("tags", [[1, 2, 3]] * 11 + [[1, 50, 3]], "FILE, row 11: column 'tags': categorical id 50 is "
                       "outside [0, 50)"),
        "bad_label": ("click", [0, 1] * 5 + [2, 0], "FILE, row 10: column 'click': label must be 0 or 1. Received: '2'"),
    }
    for name, (column, values, expected) in cases.items():
        directory = tmp_path / name
        directory.mkdir()
        message = _bad(directory, column, values)
        assert message.startswith(expected), (name, message)


def test_command_line_refuses_a_bad_file_in_one_line(tmp_path):
    rng = np.random.default_rng(2)
    data = _data(rng, 8)
    data["dense_b"] = [1.0] * 3 + [None] + [1.0] * 4
    _write_pandas(tmp_path / "train.parquet", data)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(_spec("parquet", {"train": ["train.parquet"]})))
    completed = subprocess.run([sys.executable, "-m", "tf_dlrm.data.transcode", f"--input_spec={tmp_path}/spec.yaml",
                                f"--output_dir={tmp_path}/out"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 1
    assert completed.stderr.strip().splitlines() == [
        f"error: {tmp_path}/train.parquet, row 3, column 'dense_b': the value is null; expected a number"], completed.stderr
    assert not os.path.exists(tmp_path / "out")


def _byo_both_ways(tmp_path, spec_name: str) -> None:
    """The BYO raw example transcoded from its csv files (``from_csv``) and from Parquet files pandas wrote of
    them (``from_parquet``): read by pandas (its own dtypes: float64 prices, int64 visits, strings), written with
    DataFrame.to_parquet."""
    example = os.path.join(REPO, "feature_specs", "byo_raw_example")
    raw = yaml.safe_load(open(os.path.join(example, spec_name)))
    for split, chunks in raw["source_spec"].items():
        for chunk in chunks:
            names = []
            for name in chunk["files"]:
                target = tmp_path / name.replace(".csv", ".parquet")
                pd.read_csv(os.path.join(example, name)).to_parquet(target)  # the index too, as by default
                names.append(target.name)
            chunk.update(type="parquet", files=names)
            del chunk["header"]
    (tmp_path / "parquet.yaml").write_text(yaml.safe_dump(raw))
    transcode(str(tmp_path / "parquet.yaml"), str(tmp_path / "from_parquet"))
    transcode(os.path.join(example, spec_name), str(tmp_path / "from_csv"))


@pytest.mark.parametrize("spec_name", ["feature_spec.yaml", "feature_spec_hashed.yaml"])
def test_byo_raw_example_as_pandas_writes_it_transcodes_to_the_same_bytes(tmp_path, spec_name):
    """Both encodings: the Parquet files give the same bytes as the csv (so training gives the same AUC:
    test_byo_raw_example_as_parquet_trains_to_the_auc_of_its_csv)."""
    _byo_both_ways(tmp_path, spec_name)
    from_csv, from_parquet = _listing(tmp_path / "from_csv"), _listing(tmp_path / "from_parquet")
    assert sorted(from_parquet) == sorted(from_csv)
    for name in from_csv:
        assert from_parquet[name] == from_csv[name], name
    assert _written_spec(tmp_path / "from_parquet") == _written_spec(tmp_path / "from_csv")


def test_byo_raw_example_as_parquet_trains_to_the_auc_of_its_csv(tmp_path):
    """The docs' BYO training line (docs/data.md, one process, one epoch) on both transcodes, in one process:
    the same validation AUC and logloss (1e-6)."""
    import json

    from conftest import run_python

    _byo_both_ways(tmp_path, "feature_spec.yaml")
    flags = ["--batch_size=256", "--epochs=1", "--embedding_dim=8", "--bottom_mlp_dims=16,8", "--top_mlp_dims=16,1",
             "--embedding_learning_rate=0.03", "--seed=1", "--print_freq=1000"]
    tasks = [{"name": source, "action": "train", "argv": [f"--dataset_path={tmp_path / source}", *flags]}
             for source in ("from_csv", "from_parquet")]
    (tmp_path / "tasks.json").write_text(json.dumps(tasks))
    run_python(["tests/checkpoint/checkpoint_worker.py", str(tmp_path / "tasks.json"), str(tmp_path)])
    results = json.loads((tmp_path / "results.json").read_text())
    csv, parquet = results["from_csv"], results["from_parquet"]
    print(f"BYO raw example, one epoch: csv AUC {csv['auc']:.9f} logloss {csv['logloss']:.9f}; pandas Parquet AUC "
          f"{parquet['auc']:.9f} logloss {parquet['logloss']:.9f}; |difference| AUC {abs(csv['auc'] - parquet['auc']):.3g}")
    assert csv["steps"] == parquet["steps"] == 4000 // 256
    assert csv["auc"] > 0.55  # it learned: the comparison is not of two constant models
    assert abs(csv["auc"] - parquet["auc"]) <= 1e-6 and abs(csv["logloss"] - parquet["logloss"]) <= 1e-6


def test_csv_only_keys_and_engines_are_refused(tmp_path):
    data = _data(np.random.default_rng(3), 4)
    _write_pandas(tmp_path / "train.parquet", data)
    raw = _spec("parquet", {"train": ["train.parquet"]})
    raw["source_spec"]["train"][0]["header"] = True
    (tmp_path / "header.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(TranscodeError, match=r"source_spec.train\[0\].header: a csv key; a parquet chunk finds its columns "
                                             r"by name. Received: header: True"):
        transcode(str(tmp_path / "header.yaml"), str(tmp_path / "out"))
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(_spec("parquet", {"train": ["train.parquet"]})))

    class OtherEngine:  # an engine of csv lines only
        pass

    with pytest.raises(TranscodeError, match=r"source_spec.train is a parquet chunk, which the OtherEngine does not read"):
        transcode(str(tmp_path / "spec.yaml"), str(tmp_path / "out"), engine=OtherEngine())
    assert not os.path.exists(tmp_path / "out")
