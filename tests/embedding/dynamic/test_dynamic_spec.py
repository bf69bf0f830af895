"""Dynamic tables in the feature spec: accepted forms and clear errors (feature and key named)."""

from __future__ import annotations

import pytest

from tf_dlrm.cli.dynamic_builder import dynamic_table_configs
from tf_dlrm.embedding.table_config import DynamicStorage
from tf_dlrm.spec import dynamic as dynamic_spec
from tf_dlrm.spec.feature_spec import FeatureSpec
from tf_dlrm.spec.format import FeatureSpecError


def raw_spec(**user):
    return {
        "feature_spec": {"label": {"dtype": "bool"}, "num_0": {"dtype": "float16"},
                         "user": {"dtype": "int64", "dynamic": True, "capacity": 1000, **user},
                         "item": {"dtype": "int32", "cardinality": 50}},
        "channel_spec": {"label": ["label"], "numerical": ["num_0"], "categorical": ["user", "item"]},
    }


def test_dynamic_feature_needs_no_cardinality_and_reports_its_capacity():
    spec = FeatureSpec.from_dict(raw_spec(eviction="lfu", min_count=3, capacity_scope="total"), source="s.yaml")
    assert spec.cardinalities() == [1000, 50]
    assert dynamic_spec.dynamic_features(spec) == ["user"]
    only_user = raw_spec(eviction="lfu", min_count=3, capacity_scope="total", max_idle_steps=50)
    del only_user["feature_spec"]["item"]
    only_user["channel_spec"]["categorical"] = ["user"]
    (table,) = dynamic_table_configs(FeatureSpec.from_dict(only_user), 0.05, [16])
    assert table.placement.dynamic == DynamicStorage(1000, "lfu", 3, "total", 50) and table.embedding_dim == 16


@pytest.mark.parametrize("user, message", [
    ({"capacity": 0}, "feature_spec.user.capacity: dynamic feature 'user' needs a positive integer capacity. Received: 0"),
    ({"capacity": None}, "feature_spec.user.capacity: dynamic feature 'user' needs a positive integer capacity. Received: None"),
    ({"dtype": "float32"}, "feature_spec.user.dtype: dynamic feature 'user' needs a signed integer dtype"),
    ({"eviction": "random"}, "feature_spec.user.eviction: expected one of \\['none', 'lru', 'lfu'\\]. Received: 'random'"),
    ({"min_count": 0}, "feature_spec.user.min_count: expected a positive integer. Received: 0"),
    ({"dynamic": "yes"}, "feature_spec.user.dynamic: expected true or false. Received: 'yes'"),
    ({"capacity_scope": "cluster"}, "feature_spec.user.capacity_scope: expected one of"),
    ({"max_idle_steps": 0}, "feature_spec.user.max_idle_steps: expected a positive integer .*Received: 0"),
])
def test_bad_dynamic_settings_name_the_file_feature_and_key(user, message):
    with pytest.raises(FeatureSpecError, match=f"s.yaml: {message}"):
        FeatureSpec.from_dict(raw_spec(**user), source="s.yaml")


def test_dynamic_settings_on_a_fixed_feature_are_refused():
    raw = raw_spec()
    raw["feature_spec"]["item"]["capacity"] = 10
    with pytest.raises(FeatureSpecError, match="feature_spec.item: \\['capacity'\\] only apply to dynamic tables"):
        FeatureSpec.from_dict(raw, source="s.yaml")
