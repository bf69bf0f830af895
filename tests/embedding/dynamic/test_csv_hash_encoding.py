"""A CSV with raw string categoricals and raw numbers: ``encode: hash`` turns the strings into int64
keys of dynamic tables with no user code, and ``main.py -np 2`` trains on the result."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from conftest import launch
from tf_dlrm.data.csv_values import TranscodeError, hash_key
from tf_dlrm.data.transcode import transcode
from tf_dlrm.spec.feature_spec import FeatureSpec

CITIES = [f"City {name}" for name in ("Lyon", "Oslo", "Kyoto", "Lima", "Perth", "Quito", "Turin", "Accra", "Bergen", "Cork")]


def write_dataset(directory, rows: int = 6000, seed: int = 0, encode=None, dynamic: bool = True):
    rng = np.random.default_rng(seed)
    effects = {city: rng.normal(0, 1.5) for city in CITIES}
    for split, count in (("train", rows), ("test", rows // 3)):
        lines = ["clicked,price,city,url"]
        for _ in range(count):
            city = CITIES[min(int(rng.zipf(1.5)) - 1, len(CITIES) - 1)]
            site = int(rng.integers(0, 300))
            price = float(rng.lognormal(2, 1))
            logit = effects[city] + (0.8 if site % 3 == 0 else -0.4) - 0.1 * np.log1p(price)
            label = int(rng.random() < 1 / (1 + np.exp(-logit)))
            lines.append(f"{label},{price:.3f},{city},https://shop{site}.example/item?id={site * 7}")
        (directory / f"{split}.csv").write_text("\n".join(lines) + "\n")
    categorical = {"dtype": "int64", "dynamic": True, "capacity": 1000} if dynamic else {"dtype": "int16", "cardinality": 300}
    spec = {
        "feature_spec": {"clicked": {"dtype": "bool"}, "price": {"dtype": "float32"}, "city": dict(categorical),
                         "url": dict(categorical)},
        "channel_spec": {"label": ["clicked"], "numerical": ["price"], "categorical": ["city", "url"]},
        "source_spec": {split: [{"type": "csv", "features": ["clicked", "price", "city", "url"], "files": [f"{split}.csv"],
                                 "header": True, "encode": encode or {"city": "hash", "url": "hash"}}]
                        for split in ("train", "test")},
    }
    (directory / "spec.yaml").write_text(yaml.safe_dump(spec))
    return directory / "spec.yaml"


def test_hash_encoding_writes_the_documented_keys(tmp_path):
    spec_path = write_dataset(tmp_path, rows=300)
    out = transcode(str(spec_path), str(tmp_path / "binary"))
    assert FeatureSpec.load(out.source).feature_spec["city"]["dynamic"] is True
    cities = [line.split(",")[2] for line in (tmp_path / "train.csv").read_text().splitlines()[1:]]
    keys = np.fromfile(tmp_path / "binary" / "train" / "cat_0_city.bin", dtype=np.int64)
    assert keys.tolist() == [hash_key("city", c) for c in cities]
    assert len(set(keys.tolist())) == len(set(cities))


@pytest.mark.parametrize("encode, dynamic, message", [
    ({"city": "vocabulary", "url": "hash"}, True, "encode.city: vocabulary ids are for a fixed table; a dynamic table takes encode: hash"),
    ({"city": "hash", "url": "lookup"}, True, "encode.url: expected one of \\['hash', 'vocabulary'\\]"),
    ({"city": "hash"}, False, "encode.city: a hashed feature holds raw int64 keys of a one-hot dynamic table"),
    ({"price": "hash"}, True, "encode.price: only categorical features are encoded"),
])
def test_bad_encodings_are_refused_by_name(tmp_path, encode, dynamic, message):
    spec_path = write_dataset(tmp_path, rows=30, encode=encode, dynamic=dynamic)
    with pytest.raises(TranscodeError, match=message):
        transcode(str(spec_path), str(tmp_path / "binary"))
    assert not (tmp_path / "binary").exists()


@pytest.mark.multirank
def test_string_csv_trains_on_two_ranks(tmp_path):
    spec_path = write_dataset(tmp_path, rows=20000)
    transcode(str(spec_path), str(tmp_path / "binary"))
    log = tmp_path / "log.jsonl"
    launch(2, ["main.py", f"--dataset_path={tmp_path / 'binary'}", "--embedding_dim=8", "--bottom_mlp_dims=16,8",
               "--top_mlp_dims=16,1", "--batch_size=256", "--epochs=4", "--seed=1", "--embedding_learning_rate=0.03",
               f"--log_path={log}"])
    lines = [json.loads(line) for line in open(log, encoding="utf-8")]
    final = lines[-1]
    assert final["world_size"] == 2 and final["auc"] > 0.6, final
    tables = next(e["tables"] for e in lines if e["event"] == "dynamic_tables")
    assert tables["city"]["rows"] == len(CITIES) and 250 < tables["url"]["rows"] <= 300
