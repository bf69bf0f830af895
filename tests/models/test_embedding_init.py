"""``--embedding_init`` / a table's ``initializer``: the bound of the tables' uniform initial values.

The default is Keras's [-0.05, 0.05]; ``sqrt_rows`` (``TableConfig(initializer="uniform_sqrt_rows")``)
keeps the DLRM reference's 1/sqrt(rows). Every layer that creates table values (the one-process
bank, the sharded layer's fused shards and hot-row replicas, dynamic tables) must use the bound it
was given, and a sharded table must still equal the one-process table.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, worker_env
from tf_dlrm.cli.model_config import ModelConfig, parse_embedding_init
from tf_dlrm.embedding.table_config import DEFAULT_INIT_BOUND
from tf_dlrm.embedding.table_init import initial_table_rows, initial_table_slice

CARDINALITIES = [3, 50, 40000]


def parse(argv):
    from tf_dlrm.cli import main as cli  # defines main.py's flags on absl's FLAGS
    from tf_dlrm.cli.flags import config_from_flags

    cli.FLAGS.unparse_flags()
    cli.FLAGS(["main.py", "--dataset_path=/nowhere", *argv])
    return config_from_flags(cli.FLAGS)


def test_flag_default_is_keras_bound_and_sqrt_rows_is_the_dlrm_init():
    assert DEFAULT_INIT_BOUND == 0.05
    assert parse([]).model.embedding_init_bound == 0.05
    assert parse(["--embedding_init=sqrt_rows"]).model.embedding_init_bound is None
    assert parse(["--embedding_init=0.01"]).model.embedding_init_bound == 0.01


@pytest.mark.parametrize("text", ["abc", "0", "-0.1", "inf", "nan", ""])
def test_bad_values_are_refused_naming_the_flag(text):
    with pytest.raises(ValueError, match=f"--embedding_init={text!r}".replace("[", r"\[")):
        parse_embedding_init(text)
    with pytest.raises(ValueError, match="--embedding_init"):
        ModelConfig(embedding_init_bound=-1.0)


def test_main_refuses_a_bad_value_with_exit_2():
    result = subprocess.run([sys.executable, "main.py", "--dataset_path=/nowhere", "--embedding_init=wide"], cwd=REPO,
                            env=worker_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "--embedding_init='wide'" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("bound", [None, 0.05, 0.3])
def test_values_lie_within_the_bound_and_fill_it(bound):
    for table, rows in enumerate(CARDINALITIES):
        values = initial_table_slice(seed=2, table=table, rows=rows, dim=8, init_bound=bound)
        expected = 1.0 / np.sqrt(rows) if bound is None else bound
        assert np.abs(values).max() <= expected
        assert np.abs(values).max() > 0.9 * expected  # a bound ignored or squared would fail one side
        picked = initial_table_rows(2, table, rows, 8, [0, rows - 1], init_bound=bound)
        np.testing.assert_array_equal(picked, values[[0, rows - 1]])


def test_layers_use_their_bound_and_sharded_equals_one_process():
    from tf_dlrm.embedding import TableConfig
    from tf_dlrm.sharding.plan import TableSpec
    from tf_dlrm.sharding.planner import make_plan
    from tf_dlrm.embedding.embedding_bank import EmbeddingBank
    from tests.plan_layer import plan_layer

    bank = EmbeddingBank(CARDINALITIES, 8, seed=4, init_bound=0.05)
    bank.build()
    default_bank = EmbeddingBank(CARDINALITIES, 8, seed=4)
    default_bank.build()
    assert np.abs(default_bank.tables[0].numpy()).max() > 0.3  # 1/sqrt(3) = 0.577 without a bound
    plan = make_plan([TableSpec(f"t{i}", rows, 8) for i, rows in enumerate(CARDINALITIES)], 2, strategy="column_wise",
                     data_parallel_threshold=10)
    for table, rows in enumerate(CARDINALITIES):
        np.testing.assert_array_equal(bank.tables[table].numpy(), initial_table_slice(4, table, rows, 8, init_bound=0.05))
    gathered = {}
    for rank in range(2):
        layer = plan_layer(plan, rank=rank, seed=4, initializer=0.05, hot_rows={2: [0, 7, 39999]})
        layer.build()
        config = layer.get_config()
        assert [f["table"]["initializer"] for f in config["feature_configs"]] == [0.05] * 3 and "rank" not in config
        for table, rows in enumerate(CARDINALITIES):
            for piece in layer.table_pieces(table):
                gathered.setdefault(table, {})[piece.column_start] = layer.read_piece_rows(piece, 0, rows)
        (replica,) = layer.hot_variables
        np.testing.assert_array_equal(replica.numpy(), bank.tables[2].numpy()[[0, 7, 39999]])
    for table, columns in gathered.items():
        full = np.concatenate([columns[start] for start in sorted(columns)], axis=1)
        np.testing.assert_array_equal(full, bank.tables[table].numpy())
    assert sorted(gathered) == [0, 1, 2] and len(gathered[2]) == 2  # the big table is cut in two
    with pytest.raises(ValueError, match="Received: initializer=-2"):
        TableConfig("t0", 3, 8, initializer=-2)
    with pytest.raises(ValueError, match="Received: init_bound='x'"):
        EmbeddingBank(CARDINALITIES, 8, init_bound="x")


def test_dynamic_tables_take_the_flag_and_sqrt_rows_is_one_over_sqrt_capacity():
    from tf_dlrm.cli.dynamic_builder import dynamic_table_configs
    from tf_dlrm.embedding.dynamic.layer import new_row_bound
    from tf_dlrm.spec.feature_spec import FeatureSpec

    spec = FeatureSpec.from_dict({"feature_spec": {"c": {"dtype": "int64", "dynamic": True, "capacity": 100},
                                                   "label": {"dtype": "bool"}},
                                  "channel_spec": {"categorical": ["c"], "numerical": [], "label": ["label"]},
                                  "source_spec": {}})
    assert new_row_bound(dynamic_table_configs(spec, 0.05, [4])[0]) == 0.05
    assert new_row_bound(dynamic_table_configs(spec, "uniform_sqrt_rows", [4])[0]) == pytest.approx(0.1)


def test_sqrt_rows_reaches_every_table_of_main_py():
    from tf_dlrm.cli import builder
    from tf_dlrm.cli.model_config import ModelConfig
    from tf_dlrm.spec.feature_spec import FeatureSpec

    spec = FeatureSpec.from_dict({"feature_spec": {"a": {"dtype": "int32", "cardinality": 400},
                                                   "b": {"dtype": "int32", "cardinality": 25},
                                                   "n": {"dtype": "float16"}, "label": {"dtype": "bool"}},
                                  "channel_spec": {"categorical": ["a", "b"], "numerical": ["n"], "label": ["label"]},
                                  "source_spec": {}})
    tables = builder.make_table_configs(spec, None, ModelConfig(embedding_init_bound=None))
    assert [t.init_bound for t in tables] == [None, None]  # 1/sqrt(rows): 0.05 and 0.2, not the default 0.05
    assert [t.init_bound for t in builder.make_table_configs(spec, None, ModelConfig())] == [0.05, 0.05]


def test_the_library_layer_takes_each_tables_initializer_and_keeps_it_in_its_config():
    import keras

    from tf_dlrm.embedding import DistributedEmbedding, FeatureConfig, TableConfig

    items = TableConfig("items", 30, 4, initializer=keras.initializers.RandomUniform(-0.02, 0.02))
    users = TableConfig("users", 30, 4)
    zeros = TableConfig("zeros", 30, 4, initializer="zeros")
    reference = TableConfig("reference", 30, 4, initializer="uniform_sqrt_rows")
    layer = DistributedEmbedding([FeatureConfig("item", items), FeatureConfig("user", users), FeatureConfig("z", zeros),
                                  FeatureConfig("r", reference)])
    layer.build()
    assert 0.018 < np.abs(layer.get_full_table("items")).max() <= 0.02
    assert 0.045 < np.abs(layer.get_full_table("users")).max() <= 0.05  # the default: main.py's 0.05
    assert not np.abs(layer.get_full_table("zeros")).any()
    assert np.abs(layer.get_full_table("reference")).max() > 0.15  # the DLRM reference's 1/sqrt(30) = 0.183
    restored = DistributedEmbedding.from_config(layer.get_config())
    restored.build()
    for name in ("items", "users", "zeros", "reference"):
        np.testing.assert_array_equal(restored.get_full_table(name), layer.get_full_table(name))
    with pytest.raises(ValueError, match="initializer of table 'bad'"):
        TableConfig("bad", 30, 4, initializer=keras.initializers.GlorotUniform())
