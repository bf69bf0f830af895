"""The layer has one form: features holding their TableConfig objects; what used to be the layer's own
options (hot rows, split bfloat16 storage, the initial bound) are the tables' placements and initializers."""

from __future__ import annotations

import numpy as np
import pytest

from tf_dlrm.embedding import DistributedEmbedding, FeatureConfig, Placement, TableConfig
from tf_dlrm.embedding.table_init import initial_table_rows
from tf_dlrm.parallel.env import DistributedEnv


def test_a_feature_naming_its_table_by_string_is_refused_by_name():
    with pytest.raises(ValueError, match="Expected feature 'clicks' to hold its TableConfig. Received: table='items'"):
        DistributedEmbedding([FeatureConfig("clicks", "items")])


def test_hot_rows_of_a_table_the_planner_replicates_are_refused_naming_table_and_placement():
    small = TableConfig("small", 100, 4, placement=Placement(hot_rows=[1, 2]))
    with pytest.raises(ValueError, match="Table 'small' has Placement\\(hot_rows=...\\) but is replicated on every rank"):
        DistributedEmbedding([FeatureConfig("s", small)], env=DistributedEnv(rank=0, world_size=2))


def test_placements_and_initializers_survive_the_config_and_reach_the_hot_row_replicas():
    items = TableConfig("items", 5000, 4, initializer=0.02, placement=Placement("table_wise", hot_rows=[3, 4999]))
    users = TableConfig("users", 3000, 4, initializer="uniform_sqrt_rows")
    features = [FeatureConfig("item", items), FeatureConfig("user", users)]
    layer = DistributedEmbedding(features, seed=6, env=DistributedEnv(rank=1, world_size=2), name="embedding")
    layer.build()
    (replica,) = layer.hot_variables
    np.testing.assert_array_equal(replica.numpy(), initial_table_rows(6, 0, 5000, 4, [3, 4999], init_bound=0.02))
    again = DistributedEmbedding.from_config({**layer.get_config(), "env": DistributedEnv(rank=1, world_size=2)})
    assert again.table_configs == layer.table_configs and again.hot_rows == {0: (3, 4999)}
    assert layer.table_init_bounds == (0.02, None)
