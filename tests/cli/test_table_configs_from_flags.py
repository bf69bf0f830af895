"""main.py's tables are the library's TableConfig objects: --embedding_optimizer for every table, except the ones
a model trains with its own (Wide & Deep's --wide_optimizer), which keep it, with the run's hyper-parameters, at
their rate relative to the embedding rate; --embedding_init and hot rows become each table's initializer and
placement. A trainer that ignored the tables' optimizers would train the wide tables with lazy Adam."""

from __future__ import annotations

import pytest

from tf_dlrm.cli import builder
from tf_dlrm.cli.model_config import ModelConfig, ShardingConfig
from tf_dlrm.embedding import optimizers
from tf_dlrm.models.dlrm import DLRMConfig
from tf_dlrm.models.wide_deep import WideDeepConfig
from tf_dlrm.optimizers.settings import LearningRateSchedule, OptimizerConfig
from tf_dlrm.parallel.env import DistributedEnv
from tf_dlrm.spec.feature_spec import FeatureSpec
from tf_dlrm.train.step import Trainer

SPEC = FeatureSpec.load("feature_specs/synthetic_small.yaml", check_files=False)
RUN = OptimizerConfig(LearningRateSchedule(0.001), embedding_optimizer="lazy_adam", embedding_learning_rate=0.004,
                      adagrad_initial_accumulator=0.3)


def wide_deep(rate: float) -> ModelConfig:
    return ModelConfig(name="wide_deep", params=WideDeepConfig(deep_mlp_dims=(8,), wide_optimizer="ftrl", wide_learning_rate=rate),
                       embedding_init_bound=0.02)


@pytest.mark.parametrize("rate, scale", [(0.05, 0.05 / 0.004), (0.0, 1.0)])
def test_wide_tables_keep_their_optimizer_and_rate(rate, scale):
    config = wide_deep(rate)
    plan = builder.make_sharding_plan(SPEC, config, ShardingConfig(), 1)
    tables = builder.make_table_configs(SPEC, plan, config, RUN)
    deep = len(SPEC.categorical_features)
    assert all(t.optimizer is None for t in tables[:deep])  # the run's --embedding_optimizer
    assert {t.optimizer for t in tables[deep:]} == {optimizers.FTRL(rate or 0.004, initial_accumulator_value=0.3)}  # 0: the embedding rate
    assert all(t.init_bound == 0.02 for t in tables)
    model = builder.build_model(SPEC, plan, config, DistributedEnv(), seed=1, optimizer=RUN)
    sparse = Trainer(model, DistributedEnv(), RUN).sparse
    assert [sparse.table_optimizer(t).name for t in range(len(tables))] == ["lazy_adam"] * deep + ["ftrl"] * (len(tables) - deep)
    ftrl = next(choice for choice in sparse.groups.choices if choice[0].name == "ftrl")
    assert ftrl[1] == pytest.approx(scale)
    assert ftrl[0].slots["accumulator"] == pytest.approx(0.3)


def test_hot_rows_and_split_storage_become_placements():
    config = ModelConfig(embedding_dim=128)
    plan = builder.make_sharding_plan(SPEC, config, ShardingConfig(), 2)
    tables = builder.make_table_configs(SPEC, plan, config, RUN, hot_rows={plan.model_parallel[0]: [1, 5]},
                                        split_embedding_tables=True)
    first = plan.model_parallel[0]
    assert tables[first].placement.hot_rows == (1, 5)
    assert {tables[t].placement.storage for t in plan.model_parallel} == {"split_bfloat16"}
    assert {tables[t].placement.storage for t in plan.replicated} <= {"float32"}


def test_dynamic_spec_builds_the_same_layer_with_dynamic_placements():
    """--keys=hashed data (every table dynamic) runs on DistributedEmbedding like every other spec: each
    table a dynamic placement holding the spec's capacity, eviction, min_count and capacity scope."""
    import numpy as np
    import tensorflow as tf

    from tf_dlrm.embedding import DistributedEmbedding

    raw = {"feature_spec": {"label": {"dtype": "bool"}, "num_0": {"dtype": "float16"},
                            "user": {"dtype": "int64", "dynamic": True, "capacity": 300, "eviction": "lfu",
                                     "min_count": 2, "capacity_scope": "total"},
                            "item": {"dtype": "int64", "dynamic": True, "capacity": 200}},
           "channel_spec": {"label": ["label"], "numerical": ["num_0"], "categorical": ["user", "item"]}}
    spec = FeatureSpec.from_dict(raw, source="s.yaml")
    from tf_dlrm.models.dlrm import DLRMConfig

    config = ModelConfig(embedding_dim=4, params=DLRMConfig(bottom_mlp_dims=(4,), top_mlp_dims=(1,)))
    model = builder.build_model(spec, None, config, DistributedEnv(), seed=1, optimizer=RUN)
    embedding = model.embedding
    assert isinstance(embedding, DistributedEmbedding) and embedding.dynamic_only
    storage = {f.name: f.table.placement.dynamic for f in embedding.features}
    assert (storage["user"].capacity, storage["user"].eviction, storage["user"].min_count,
            storage["user"].capacity_scope) == (300, "lfu", 2, "total")
    assert (storage["item"].capacity, storage["item"].eviction, storage["item"].min_count) == (200, "none", 1)
    keys = {"user": tf.constant([7, 10**12, 7], tf.int64), "item": tf.constant([-3, 5, 5], tf.int64)}
    seen = embedding(keys, training=True, stacked=True)
    assert seen.shape == (3, 2, 4)
    # min_count=2: user key 7 (seen twice in this batch) has a row now; the key seen once reads zeros.
    again = embedding(keys, training=False, stacked=True).numpy()
    assert np.any(again[0, 0] != 0) and np.all(again[1, 0] == 0)
    assert embedding.get_config()["feature_configs"][0]["table"]["placement"]["dynamic"]["capacity_scope"] == "total"


@pytest.mark.parametrize("world_size", [2, 4])
def test_rowwise_adagrad_keeps_multi_hot_tables_whole_and_every_rank_trains(world_size):
    """--embedding_optimizer=rowwise_adagrad --dist_strategy=column_wise on multi-hot data: row-wise state is exact on
    column slices only for one one-hot lookup per sample, so the multi-hot tables stay whole and the one-hot ones are
    cut; every rank's trainer accepts its layer (it refused the plan it was given before)."""
    spec = FeatureSpec.load("feature_specs/synthetic_multi_hot.yaml", check_files=False)
    config = ModelConfig(embedding_dim=8, params=DLRMConfig((8,), (8, 1), interaction="cat"))
    sharding = ShardingConfig(strategy="column_wise", data_parallel_threshold=0)
    run = OptimizerConfig(LearningRateSchedule(0.01), embedding_optimizer="rowwise_adagrad")
    plan = builder.make_sharding_plan(spec, config, sharding, world_size, run)
    slices = {name: len(plan.table_slices(t)) for t, name in enumerate(spec.categorical_features)}
    assert all(slices[name] == 1 for name in spec.categorical_features if spec.hotness(name) > 1 or spec.ragged(name)), slices
    assert any(count > 1 for count in slices.values()), slices  # the one-hot tables are still cut
    # Without the optimizer (a plan for SGD), the same strategy cuts the multi-hot tables too.
    assert any(len(builder.make_sharding_plan(spec, config, sharding, world_size).table_slices(t)) > 1
               for t, name in enumerate(spec.categorical_features) if spec.hotness(name) > 1)
    for rank in range(world_size):
        env = DistributedEnv(rank=rank, world_size=world_size)
        Trainer(builder.build_model(spec, plan, config, env, seed=1, optimizer=run), env, run)
