"""A weighted feature's split_binary layout: a weights file beside the lengths file (float32, one per id), written by
SplitBinaryWriter, read back by rank as ``<feature>_weights`` ragged like the ids, and bad weights files and spec
keys refused naming the file, the feature and the first sample without its weights."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf
import yaml

from tf_dlrm.data.reader import SplitBinaryReader
from tf_dlrm.data.split_binary import SplitBinaryWriter
from tf_dlrm.data.validation import BadDataError
from tf_dlrm.spec.feature_spec import FeatureSpec
from tf_dlrm.spec.format import FeatureSpecError

ROWS, HOTNESS = 64, 5


def spec_dict(weights: bool = True) -> dict:
    history = {"type": "split_binary", "features": ["history"], "files": ["train/history.bin"],
               "lengths": "train/history.lengths.bin"}
    if weights:
        history["weights"] = "train/history.weights.bin"
    return {
        "feature_spec": {"label": {"dtype": "bool"}, "num_0": {"dtype": "float16"},
                         "item": {"dtype": "int32", "cardinality": 100},
                         "history": {"dtype": "int32", "cardinality": 100, "hotness": HOTNESS, "ragged": True,
                                     "combiner": "mean", "weighted": True}},
        "channel_spec": {"label": ["label"], "numerical": ["num_0"], "categorical": ["item", "history"]},
        "source_spec": {"train": [
            {"type": "split_binary", "features": ["label"], "files": ["train/label.bin"]},
            {"type": "split_binary", "features": ["num_0"], "files": ["train/numerical.bin"]},
            {"type": "split_binary", "features": ["item"], "files": ["train/item.bin"]},
            history]},
    }


def data():
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, HOTNESS + 1, ROWS)
    return {"label": rng.integers(0, 2, ROWS), "numerical": rng.normal(size=(ROWS, 1)), "item": rng.integers(0, 100, ROWS),
            "ids": rng.integers(0, 100, lengths.sum()), "lengths": lengths,
            "weights": rng.uniform(0, 2, lengths.sum()).astype(np.float32)}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[FeatureSpec, dict]:
    directory = tmp_path_factory.mktemp("weighted")
    path = directory / "feature_spec.yaml"
    path.write_text(yaml.safe_dump(spec_dict()))
    spec, rows = FeatureSpec.load(str(path), check_files=False), data()
    with SplitBinaryWriter(spec, "train") as writer:
        writer.append(rows["label"], rows["numerical"], [rows["item"], (rows["ids"], rows["lengths"], rows["weights"])])
    return FeatureSpec.load(str(path)), rows


def test_each_rank_reads_the_weights_of_its_rows(written):
    spec, rows = written
    assert spec.weighted("history") and not spec.weighted("item")
    expected = tf.RaggedTensor.from_row_lengths(rows["weights"], rows["lengths"]).to_list()
    ids = tf.RaggedTensor.from_row_lengths(rows["ids"], rows["lengths"]).to_list()
    for mode, first in (("global", 32), ("local", 48)):
        reader = SplitBinaryReader(spec, "train", 32, rank=1, world_size=2, input_modes={"history": mode, "item": "local"})
        features, _ = list(reader.dataset())[1]
        assert sorted(features) == ["history", "history_weights", "item", "numerical"]
        count = features["history"].nrows()
        assert features["history"].to_list() == ids[first:first + count]
        assert features["history_weights"].to_list() == expected[first:first + count]
        assert features["history_weights"].row_lengths().numpy().tolist() == rows["lengths"][first:first + count].tolist()


def test_a_weights_file_short_of_the_ids_is_named_with_its_first_row_without_weights(written, tmp_path):
    spec, rows = written
    path = spec.resolve("train/history.weights.bin")
    short = tmp_path / "short.weights.bin"
    # Drop the weights of the last ids: the first sample missing one is the one holding id number total - 3.
    short.write_bytes(open(path, "rb").read()[:-12])
    copy = FeatureSpec.from_dict({**spec_dict(), "source_spec": {"train": [
        {**c, "files": [spec.resolve(c["files"][0])], **({"lengths": spec.resolve(c["lengths"]), "weights": str(short)}
                                                         if "lengths" in c else {})}
        for c in spec_dict()["source_spec"]["train"]]}}, base_directory=str(tmp_path))
    ends = np.cumsum(rows["lengths"])
    sample = int(np.searchsorted(ends, ends[-1] - 3, side="right"))
    with pytest.raises(BadDataError, match=rf"feature 'history', file {short}: holds {ends[-1] - 3} weights .* "
                                           rf"the feature has {ends[-1]} ids .*sample {sample} is the first without"):
        SplitBinaryReader(copy, "train", 32, input_modes={"history": "local", "item": "local"})


def test_the_spec_keys_are_checked():
    with pytest.raises(FeatureSpecError, match="feature 'history' says 'weighted: true': its chunk needs a weights file"):
        FeatureSpec.from_dict(spec_dict(weights=False))
    unweighted = spec_dict()
    unweighted["feature_spec"]["history"]["weighted"] = False
    with pytest.raises(FeatureSpecError, match=r"\.weights: feature 'history' has a weights file: it must be .*'weighted: true'"):
        FeatureSpec.from_dict(unweighted)
    bad = spec_dict()
    bad["feature_spec"]["history"]["weighted"] = "yes"
    with pytest.raises(FeatureSpecError, match=r"feature_spec\.history\.weighted: expected true or false"):
        FeatureSpec.from_dict(bad)


def test_the_writer_refuses_a_weight_count_that_is_not_the_id_count(tmp_path):
    path = tmp_path / "feature_spec.yaml"
    path.write_text(yaml.safe_dump(spec_dict()))
    spec, rows = FeatureSpec.load(str(path), check_files=False), data()
    with pytest.raises(ValueError, match=r"feature 'history': expected one weight per id"):
        with SplitBinaryWriter(spec, "train") as writer:
            writer.append(rows["label"], rows["numerical"], [rows["item"], (rows["ids"], rows["lengths"], rows["weights"][:-1])])
    assert not os.path.exists(spec.resolve("train/history.weights.bin"))


def write_dataset(directory) -> str:
    """A train and a test split of :func:`spec_dict`'s layout whose label follows the item."""
    layout = spec_dict()
    layout["source_spec"]["test"] = [
        {key: ([f.replace("train/", "test/") for f in value] if key == "files" else
               value.replace("train/", "test/") if key in ("lengths", "weights") else value) for key, value in chunk.items()}
        for chunk in layout["source_spec"]["train"]]
    os.makedirs(str(directory), exist_ok=True)
    path = os.path.join(str(directory), "feature_spec.yaml")
    with open(path, "w") as handle:
        yaml.safe_dump(layout, handle)
    spec = FeatureSpec.load(path, check_files=False)
    for split, count, seed in (("train", 4096, 1), ("test", 1024, 2)):
        rng = np.random.default_rng(seed)
        lengths = rng.integers(0, HOTNESS + 1, count)
        item = rng.integers(0, 100, count)
        label = rng.random(count) < 1 / (1 + np.exp(-np.sin(item * 0.3)))
        with SplitBinaryWriter(spec, split) as writer:
            writer.append(label, rng.normal(size=(count, 1)), [item, (rng.integers(0, 100, lengths.sum()), lengths,
                                                                      rng.uniform(0, 2, lengths.sum()))])
    return str(directory)


@pytest.mark.multirank
@pytest.mark.parametrize("layout", [["--dist_strategy=column_wise"], ["--dist_strategy=table_wise", "--data_parallel_input"]],
                         ids=["column_wise-global_ids", "table_wise-exchanged_ids"])
def test_main_trains_a_weighted_feature_on_two_ranks_like_one_process(tmp_path, layout):
    """Both tables model-parallel (no threshold replicates them): column slices read the global batch of ids and
    weights; whole tables on one rank each get them through the id exchange."""
    import json

    from conftest import launch, run_python

    data = write_dataset(tmp_path / "data")
    flags = [f"--dataset_path={data}", "--batch_size=256", "--max_steps=20", "--embedding_dim=8", "--bottom_mlp_dims=8",
             "--top_mlp_dims=8,1", "--calibration=none", "--data_parallel_threshold=0", *layout]
    run_python(["main.py", *flags, f"--log_path={tmp_path / 'np1.json'}", f"--save_checkpoint_path={tmp_path / 'ckpt'}"])
    launch(2, ["main.py", *flags, f"--log_path={tmp_path / 'np2.json'}"])
    one, two = (json.loads(open(tmp_path / f"np{n}.json").read().splitlines()[-1]) for n in (1, 2))
    # The test logloss of 1024 rows after 16 steps: sums in another order move it by float32 rounding only.
    assert abs(one["logloss"] - two["logloss"]) <= 1e-6 and two["world_size"] == 2
    print(f"main.py {' '.join(layout)} with a weighted feature: test logloss {one['logloss']!r} (1 process), {two['logloss']!r} (2 ranks)")
    # Exported, the weights are served beside the ids; under mean, a sample of one id ignores its weight's size.
    run_python(["main.py", *flags, "--mode=export", f"--restore_checkpoint_path={tmp_path / 'ckpt'}",
                f"--saved_model_path={tmp_path / 'serving'}"])
    serve = tf.saved_model.load(str(tmp_path / "serving")).signatures["serving_default"]
    assert sorted(serve.structured_input_signature[1]) == [
        "history_row_lengths", "history_values", "history_weights_row_lengths", "history_weights_values", "item", "numerical"]
    given = dict(numerical=tf.zeros([2, 1]), item=tf.constant([3, 4], tf.int64), history_values=tf.constant([1, 2, 3], tf.int64),
                 history_row_lengths=tf.constant([2, 1], tf.int64), history_weights_row_lengths=tf.constant([2, 1], tf.int64))
    weighted = serve(**given, history_weights_values=tf.constant([0.5, 1.0, 2.0]))["probability"].numpy()
    plain = serve(**given, history_weights_values=tf.constant([1.0, 1.0, 1.0]))["probability"].numpy()
    assert weighted[0] != plain[0] and abs(weighted[1] - plain[1]) <= 1e-7


CELLS = ["12|7|99", "", "5", "1|2|3|4"]
WEIGHT_CELLS = ["0.5|1|2", "", "3.25", "1|0|0.125|4"]


def weighted_csv_spec(directory, weights: list[str], chunk_type: str = "csv", files=("train.csv",)) -> str:
    raw = {"feature_spec": {"click": {"dtype": "int8"}, "site": {"dtype": "int64", "cardinality": 4},
                            "items": {"dtype": "int64", "cardinality": 300, "hotness": 4, "combiner": "mean", "ragged": True,
                                      "weighted": True},
                            "item_weights": {"dtype": "float32"}},
           "channel_spec": {"label": ["click"], "categorical": ["site", "items"]},
           "source_spec": {"train": [{"type": chunk_type, "features": ["click", "site", "items", "item_weights"],
                                      "files": list(files), "weights": {"items": "item_weights"}}]}}
    if chunk_type == "csv":
        (directory / "train.csv").write_text("".join(f"{i % 2},{i % 4},{cell},{w}\n"
                                                     for i, (cell, w) in enumerate(zip(CELLS, weights))))
    (directory / "input.yaml").write_text(yaml.safe_dump(raw))
    return str(directory / "input.yaml")


def test_a_csv_weights_column_transcodes_to_the_weights_file(tmp_path):
    from tf_dlrm.data.transcode import transcode

    spec = transcode(weighted_csv_spec(tmp_path, WEIGHT_CELLS), str(tmp_path / "out"))
    (chunk,) = [c for c in spec.chunks("train") if c["features"] == ["items"]]
    assert chunk["weights"] == "train/cat_1_items.weights.bin" and spec.weighted("items")
    expected = [[float(w) for w in cell.split("|")] if cell else [] for cell in WEIGHT_CELLS]
    assert np.fromfile(spec.resolve(chunk["weights"]), np.float32).tolist() == [w for row in expected for w in row]
    features, _ = next(iter(SplitBinaryReader(spec, "train", 4).dataset()))
    assert features["items_weights"].to_list() == expected
    assert features["items"].to_list() == [[int(i) for i in cell.split("|")] if cell else [] for cell in CELLS]


def test_a_row_whose_weights_do_not_match_its_ids_is_named(tmp_path):
    from tf_dlrm.data.csv_values import TranscodeError
    from tf_dlrm.data.transcode import transcode

    bad = WEIGHT_CELLS[:2] + ["3.25|1"] + WEIGHT_CELLS[3:]
    with pytest.raises(TranscodeError, match=r"train.csv, line 3: column 4 \('item_weights'\): 2 weights in '3.25\|1' for "
                                             r"the 1 ids of feature 'items' \(one weight per id"):
        transcode(weighted_csv_spec(tmp_path, bad), str(tmp_path / "out"))
    with pytest.raises(TranscodeError, match=r"train.csv, line 4: column 4 \('item_weights'\): 'x' is not a number"):
        transcode(weighted_csv_spec(tmp_path, WEIGHT_CELLS[:3] + ["1|x|0|4"]), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
    missing = yaml.safe_load(open(weighted_csv_spec(tmp_path, WEIGHT_CELLS)))
    del missing["source_spec"]["train"][0]["weights"]
    with pytest.raises(FeatureSpecError, match=r"\.weights: feature 'items' says 'weighted: true': name the column"):
        FeatureSpec.from_dict(missing)


def test_a_parquet_list_of_weights_transcodes_like_csv(tmp_path):
    pandas = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    from tf_dlrm.data.transcode import transcode

    csv = transcode(weighted_csv_spec(tmp_path, WEIGHT_CELLS), str(tmp_path / "from_csv"))
    rows = [[int(i) for i in cell.split("|")] if cell else [] for cell in CELLS]
    weights = [[float(w) for w in cell.split("|")] if cell else [] for cell in WEIGHT_CELLS]
    frame = pandas.DataFrame({"click": [i % 2 for i in range(4)], "site": [i % 4 for i in range(4)], "items": rows,
                              "item_weights": weights})
    frame.to_parquet(tmp_path / "train.parquet")
    parquet = transcode(weighted_csv_spec(tmp_path, WEIGHT_CELLS, "parquet", ["train.parquet"]), str(tmp_path / "from_parquet"))
    for chunk in csv.chunks("train"):
        for relative in chunk["files"] + [chunk[k] for k in ("lengths", "weights") if k in chunk]:
            assert open(csv.resolve(relative), "rb").read() == open(parquet.resolve(relative), "rb").read(), relative


def test_spark_writes_the_weights_file_byte_for_byte_like_the_local_engine(tmp_path):
    pytest.importorskip("pyspark", reason="the Spark engine needs PySpark: make install-spark")
    from tf_dlrm.data.transcode import transcode
    from tf_dlrm.data.transcode_spark import SparkEngine, make_session

    session = make_session("local[2]", conf={"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2",
                                              "spark.ui.showConsoleProgress": "false", "spark.driver.memory": "1g"})
    try:
        spec_path = weighted_csv_spec(tmp_path, WEIGHT_CELLS)
        local = transcode(spec_path, str(tmp_path / "local"))
        spark = transcode(spec_path, str(tmp_path / "spark"), engine=SparkEngine(session, min_partitions=2, block_lines=3))
    finally:
        session.stop()
    for chunk in local.chunks("train"):
        for relative in chunk["files"] + [chunk[k] for k in ("lengths", "weights") if k in chunk]:
            assert open(local.resolve(relative), "rb").read() == open(spark.resolve(relative), "rb").read(), relative
