"""``tf_dlrm.data.synthetic --hashed_keys``: the same samples as the id dataset, ids replaced by sparse
int64 keys (a bijection per table), a spec of dynamic tables, new keys appearing along the stream."""

from __future__ import annotations

import os

import numpy as np

from tf_dlrm.data.hidden_model import GeneratorConfig
from tf_dlrm.data.synthetic import generate
from tf_dlrm.sharding.dynamic_routing import mix64
from tf_dlrm.spec.feature_spec import FeatureSpec

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_hashed_keys_replace_ids_one_to_one(tmp_path):
    spec = FeatureSpec.load(os.path.join(REPO, "feature_specs", "synthetic_small.yaml"), check_files=False)
    plain = generate(spec, str(tmp_path / "ids"), 4000, 500, seed=3)
    hashed = generate(spec, str(tmp_path / "keys"), 4000, 500, seed=3, config=GeneratorConfig(hashed_keys=True))
    loaded = FeatureSpec.load(hashed.source)
    for table, name in enumerate(loaded.categorical_features):
        properties = loaded.feature_spec[name]
        assert properties["dtype"] == "int64" and properties["dynamic"] is True
        assert properties["capacity"] == plain.feature_spec[name]["cardinality"]
        ids = np.fromfile(tmp_path / "ids" / "train" / name, dtype=plain.dtype(name)).astype(np.int64)
        keys = np.fromfile(tmp_path / "keys" / "train" / name, dtype=np.int64)
        np.testing.assert_array_equal(keys, mix64(ids | np.int64(table << 33)).view(np.int64))
        assert len(np.unique(keys)) == len(np.unique(ids))
    for name in ("label.bin", "numerical.bin"):
        assert (tmp_path / "ids" / "train" / name).read_bytes() == (tmp_path / "keys" / "train" / name).read_bytes()
    # New keys keep appearing: the largest table's second half brings keys the first half never had.
    keys = np.fromfile(tmp_path / "keys" / "train" / loaded.categorical_features[-1], dtype=np.int64)
    assert len(set(keys[2000:]) - set(keys[:2000])) > 100
    assert keys.min() < 0 < keys.max()
