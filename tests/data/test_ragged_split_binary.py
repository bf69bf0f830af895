"""split_binary's variable-length layout (a lengths file beside the ids file): the synthetic generator
writes it with --variable_hotness, the reader gives each rank its rows as written (decoded here with
plain numpy), rows longer than hotness and ids files that do not match their lengths are refused in
one line naming file, feature and sample, and the hidden model pools short rows as the combiners do."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf
import yaml

from tf_dlrm.data.hidden_model import GeneratorConfig, HiddenModel
from tf_dlrm.data.reader import SplitBinaryReader
from tf_dlrm.data.synthetic import generate
from tf_dlrm.data.validation import BadDataError
from tf_dlrm.spec.feature_spec import FeatureSpec
from tf_dlrm.spec.format import FeatureSpecError

SPEC = os.path.join(os.path.dirname(__file__), "..", "..", "feature_specs", "synthetic_multi_hot.yaml")


@pytest.fixture(scope="module")
def variable(tmp_path_factory):
    spec = FeatureSpec.load(SPEC, check_files=False)
    root = tmp_path_factory.mktemp("variable")
    return generate(spec, str(root / "data"), num_train_samples=1000, num_valid_samples=300, seed=5,
                    config=GeneratorConfig(variable_hotness=True))


def rows_by_numpy(spec: FeatureSpec, split: str, name: str) -> list[list[int]]:
    """The rows of a variable-length feature decoded with numpy alone: lengths, cumulative sum, slices."""
    (chunk,) = [c for c in spec.chunks(split) if c["features"] == [name]]
    lengths = np.fromfile(spec.resolve(chunk["lengths"]), np.int8)
    ids = np.fromfile(spec.resolve(chunk["files"][0]), spec.dtype(name))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    assert offsets[-1] == ids.size
    return [list(ids[offsets[i]:offsets[i + 1]]) for i in range(lengths.size)]


def test_the_generator_writes_rows_of_one_to_hotness_ids(variable):
    names = [n for n in variable.categorical_features if variable.hotness(n) > 1]
    for name in names:
        assert variable.ragged(name)
        rows = rows_by_numpy(variable, "train", name)
        lengths = np.array([len(r) for r in rows])
        hotness = variable.hotness(name)
        assert len(rows) == 1000 and lengths.min() == 1 and lengths.max() == hotness, name
        assert np.mean(lengths == 1) > np.mean(lengths == hotness), name  # power law: short rows are the common ones
    one_hot = [c for c in variable.chunks("train") if variable.hotness(c["features"][0]) == 1]
    assert not any("lengths" in c for c in one_hot)
    assert "1 to hotness ids" in variable.metadata["generator"] and 0.7 < variable.metadata["oracle_valid_auc"] < 1


def test_each_rank_reads_its_rows_as_written(variable):
    names = variable.categorical_features
    reader = SplitBinaryReader(variable, "train", 200, rank=1, world_size=2,
                               input_modes={names[1]: "global", names[0]: "local", names[3]: "local", names[6]: "local"})
    features, _ = list(reader.dataset())[2]
    start = 2 * 200
    assert isinstance(features[names[1]], tf.RaggedTensor) and features[names[1]].shape[0] == 200
    assert features[names[1]].to_list() == rows_by_numpy(variable, "train", names[1])[start:start + 200]  # global batch
    assert features[names[3]].to_list() == rows_by_numpy(variable, "train", names[3])[start + 100:start + 200]  # local
    assert features[names[6]].to_list() == rows_by_numpy(variable, "train", names[6])[start + 100:start + 200]
    assert not isinstance(features[names[0]], tf.RaggedTensor)


def test_the_padded_last_batch_holds_empty_rows(variable):
    name = variable.categorical_features[3]
    reader = SplitBinaryReader(variable, "validation", 128, input_modes={name: "local"}, last_batch="pad")
    last, _ = list(reader.dataset())[-1]
    rows = last[name].to_list()
    assert len(rows) == 128 and rows[:300 - 256] == rows_by_numpy(variable, "validation", variable.categorical_features[3])[256:]
    assert rows[300 - 256:] == [[]] * (128 - 44)


def _copy_with(variable, tmp_path, change) -> FeatureSpec:
    """The train split of ``variable`` with cat_3.bin's files changed by ``change(lengths, ids)``."""
    raw = variable.to_dict()
    raw["source_spec"] = {"train": raw["source_spec"]["train"]}
    for chunk in raw["source_spec"]["train"]:
        for key in ("files", "lengths"):
            if key in chunk:
                paths = chunk[key] if key == "files" else [chunk[key]]
                for path in paths:
                    os.makedirs(tmp_path / os.path.dirname(path), exist_ok=True)
                    (tmp_path / path).write_bytes(open(variable.resolve(path), "rb").read())
    lengths_path = tmp_path / "train" / "cat_3.lengths.bin"
    ids_path = tmp_path / "train" / "cat_3.bin"
    lengths, ids = change(np.fromfile(lengths_path, np.int8), np.fromfile(ids_path, np.int16))
    lengths.astype(np.int8).tofile(lengths_path)
    ids.astype(np.int16).tofile(ids_path)
    with open(tmp_path / "feature_spec.yaml", "w") as handle:
        yaml.safe_dump(raw, handle)
    return FeatureSpec.load(str(tmp_path / "feature_spec.yaml"))


def test_a_row_longer_than_hotness_is_named_with_file_feature_and_sample(variable, tmp_path):
    def longer(lengths, ids):
        offset = int(lengths[:637].sum())
        lengths[637] += 5
        return lengths, np.concatenate([ids[:offset], np.zeros(5, ids.dtype), ids[offset:]])

    spec = _copy_with(variable, tmp_path, longer)
    hotness = spec.hotness("cat_3.bin")
    with pytest.raises(BadDataError) as caught:
        SplitBinaryReader(spec, "train", 100, input_modes={"cat_3.bin": "local"})
    found = np.fromfile(tmp_path / "train" / "cat_3.lengths.bin", np.int8)[637]
    assert str(caught.value) == (f"split 'train', feature 'cat_3.bin', file {tmp_path}/train/cat_3.lengths.bin: "
                                 f"sample 637 holds {found} ids, more than its hotness {hotness}")
    # A rank that does not read the feature opens the split all the same.
    SplitBinaryReader(spec, "train", 100, input_modes={spec.categorical_features[0]: "local"})


def test_an_ids_file_that_does_not_hold_the_sum_of_the_lengths_is_refused(variable, tmp_path):
    spec = _copy_with(variable, tmp_path, lambda lengths, ids: (lengths, ids[:-3]))
    total = int(np.fromfile(tmp_path / "train" / "cat_3.lengths.bin", np.int8).sum())
    with pytest.raises(BadDataError, match=rf"feature 'cat_3.bin', file .*/train/cat_3.bin: holds {total - 3} ids "
                                           rf"\({2 * (total - 3)} bytes\), but the lengths in .*cat_3.lengths.bin add up to {total}"):
        SplitBinaryReader(spec, "train", 100, input_modes={"cat_3.bin": "local"})


def test_an_id_out_of_range_is_named_by_its_sample(variable, tmp_path):
    def bad(lengths, ids):
        ids[int(lengths[:150].sum())] = 9999  # the first id of sample 150
        return lengths, ids

    spec = _copy_with(variable, tmp_path, bad)
    reader = SplitBinaryReader(spec, "train", 100, input_modes={"cat_3.bin": "local"})
    with pytest.raises(BadDataError, match=r"feature 'cat_3.bin', file .*cat_3.bin: sample 150 has id 9999 outside \[0, 600\)"):
        reader.read_batch(1)


def test_the_spec_key_is_checked(variable):
    raw = variable.to_dict()
    chunk = next(c for c in raw["source_spec"]["train"] if c["features"] == ["cat_3.bin"])
    del raw["feature_spec"]["cat_3.bin"]["ragged"]
    with pytest.raises(FeatureSpecError, match=r"source_spec.train\[5\].lengths: feature 'cat_3.bin' has a lengths file "
                                               r".*must say 'ragged: true'"):
        FeatureSpec.from_dict(raw)
    raw["feature_spec"]["cat_3.bin"]["ragged"] = True
    chunk["lengths"] = 3
    with pytest.raises(FeatureSpecError, match=r"lengths: expected the relative path"):
        FeatureSpec.from_dict(raw)


def test_the_hidden_model_pools_short_rows_by_their_own_count():
    """mean divides by the row's own count, sqrtn by its square root, sum adds what is there; an empty row is zeros."""
    spec = FeatureSpec({"label": {"dtype": "bool"}, **{f"c{i}": {"dtype": "int32", "cardinality": 50, "hotness": 4,
                                                               "combiner": c} for i, c in enumerate(["sum", "mean", "sqrtn"])}},
                       {"label": ["label"], "categorical": ["c0", "c1", "c2"]})
    model = HiddenModel(spec, 0, GeneratorConfig(variable_hotness=True))
    ranks = np.array([[3, 7, -1, -1], [5, -1, -1, -1], [-1, -1, -1, -1], [1, 2, 3, 4]])
    for table, divide in enumerate([lambda n: 1, lambda n: n, np.sqrt]):
        effects = model.effects[table]
        expected = [(effects[3] + effects[7]) / divide(2), effects[5] / divide(1), 0.0, effects[[1, 2, 3, 4]].sum() / divide(4)]
        np.testing.assert_allclose(model._pooled(table, effects, ranks), expected, rtol=1e-12)
    _, drawn, ids = model.sample(np.random.default_rng(1), 500)
    lengths = (drawn[0] >= 0).sum(axis=1)
    assert lengths.min() == 1 and lengths.max() == 4 and ((ids[0] >= 0) == (drawn[0] >= 0)).all()


def test_variable_rows_move_to_nvidias_split_tfrecords_unchanged(variable, tmp_path):
    from tf_dlrm.data.split_tfrecords import SplitTFRecordsReader, ragged_by_default
    from tf_dlrm.data.to_split_tfrecords import convert

    convert(os.path.dirname(variable.source), str(tmp_path / "records"), prebatch_size=64, prebatches_per_file=8)
    records = ragged_by_default(FeatureSpec.load(str(tmp_path / "records" / "feature_spec.yaml"), check_files=False))
    names = [variable.categorical_features[index] for index in (3, 6)]
    features, _ = list(SplitTFRecordsReader(records, "train", 250, input_modes=dict.fromkeys(names, "local")).dataset())[1]
    assert sorted(features) == sorted(["numerical", *names])
    for name in names:
        assert features[name].to_list() == rows_by_numpy(variable, "train", name)[250:500]


def _variable_csv_spec(tmp_path, cells: list[str], chunk_type="csv", files=("train.csv",)) -> str:
    raw = {"feature_spec": {"click": {"dtype": "int8"}, "site": {"dtype": "int64", "cardinality": 4},
                            "items": {"dtype": "int64", "cardinality": 300, "hotness": 4, "combiner": "mean", "ragged": True}},
           "channel_spec": {"label": ["click"], "categorical": ["site", "items"]},
           "source_spec": {"train": [{"type": chunk_type, "features": ["click", "site", "items"], "files": list(files)}]}}
    if chunk_type == "csv":
        (tmp_path / "train.csv").write_text("".join(f"{i % 2},{i % 4},{cell}\n" for i, cell in enumerate(cells)))
    (tmp_path / "input.yaml").write_text(yaml.safe_dump(raw))
    return str(tmp_path / "input.yaml")


CELLS = ["12|7|99", "", "5", "1|2|3|4", "250|250", "8", "", "0|299|3"]
ROWS = [[12, 7, 99], [], [5], [1, 2, 3, 4], [250, 250], [8], [], [0, 299, 3]]


def test_csv_cells_of_zero_to_hotness_ids_transcode_to_the_lengths_layout(tmp_path):
    from tf_dlrm.data.transcode import transcode

    spec = transcode(_variable_csv_spec(tmp_path, CELLS), str(tmp_path / "out"))
    (chunk,) = [c for c in spec.chunks("train") if c["features"] == ["items"]]
    assert chunk["lengths"] == "train/cat_1_items.lengths.bin" and spec.ragged("items")
    assert list(np.fromfile(spec.resolve(chunk["lengths"]), np.int8)) == [len(r) for r in ROWS]
    assert list(np.fromfile(spec.resolve(chunk["files"][0]), np.int16)) == [i for r in ROWS for i in r]
    features, _ = next(iter(SplitBinaryReader(spec, "train", 8).dataset()))
    assert features["items"].to_list() == ROWS


def test_a_csv_cell_longer_than_hotness_is_named(tmp_path):
    from tf_dlrm.data.csv_values import TranscodeError
    from tf_dlrm.data.transcode import transcode

    with pytest.raises(TranscodeError, match=r"train.csv, line 4: column 3 \('items'\): 5 ids in '1\|2\|3\|4\|5', more "
                                             r"than the feature's hotness 4 \(a variable-length cell holds 0 to hotness ids"):
        transcode(_variable_csv_spec(tmp_path, CELLS[:3] + ["1|2|3|4|5"]), str(tmp_path / "out"))
    with pytest.raises(TranscodeError, match=r"line 3: column 3 \('items'\): categorical id 300 is outside \[0, 300\)"):
        transcode(_variable_csv_spec(tmp_path, CELLS[:2] + ["7|300"]), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_parquet_list_columns_of_any_length_transcode_like_csv(tmp_path):
    pandas = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    from tf_dlrm.data.transcode import transcode

    csv = transcode(_variable_csv_spec(tmp_path, CELLS), str(tmp_path / "from_csv"))
    frame = pandas.DataFrame({"click": [i % 2 for i in range(8)], "site": [i % 4 for i in range(8)], "items": ROWS})
    frame.to_parquet(tmp_path / "train.parquet")
    parquet = transcode(_variable_csv_spec(tmp_path, [], "parquet", ["train.parquet"]), str(tmp_path / "from_parquet"))
    for chunk in csv.chunks("train"):
        for relative in chunk["files"] + ([chunk["lengths"]] if "lengths" in chunk else []):
            assert open(csv.resolve(relative), "rb").read() == open(parquet.resolve(relative), "rb").read(), relative


def test_the_dataset_check_reads_variable_length_features(variable, tmp_path):
    from tf_dlrm.data.check import scan_split

    assert scan_split(variable, "train", block=128) == []

    def bad(lengths, ids):
        ids[int(lengths[:301].sum()) - 1] = -2  # the last id of sample 300
        ids[int(lengths[:900].sum())] = 600
        return lengths, ids

    spec = _copy_with(variable, tmp_path / "ids", bad)
    assert scan_split(spec, "train", block=128) == [
        f"split 'train', feature 'cat_3.bin', file {tmp_path}/ids/train/cat_3.bin: 2 id(s) outside [0, 600), the first at "
        "sample 300"]
    spec = _copy_with(variable, tmp_path / "lengths", lambda lengths, ids: (np.where(np.arange(lengths.size) == 7, 9, lengths), ids))
    (line,) = scan_split(spec, "train", block=128)
    assert line == (f"split 'train', feature 'cat_3.bin', file {tmp_path}/lengths/train/cat_3.lengths.bin: sample 7 holds 9 "
                    "ids, more than its hotness 5")
