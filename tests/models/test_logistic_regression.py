"""--model=logistic_regression: found by the registry, width-1 tables, the logit it computes, and
training through main.py (one process and two ranks) to a useful AUC."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import launch, make_synthetic_small, run_python

STEPS = 60


def test_registered_by_name_with_width_one_tables():
    from tf_dlrm.embedding.table_config import FeatureConfig, TableConfig
    from tf_dlrm.models import registry

    cls = registry.lookup("logistic_regression")
    assert registry.reference_of(cls) == "logistic_regression"
    tables = cls.tables(cls.Config(), [TableConfig("a", 10, 16), TableConfig("b", 7, 8)])
    assert [(t.name, t.vocabulary_size, t.embedding_dim) for t in tables] == [("a", 10, 1), ("b", 7, 1)]
    features, sources = cls.features(cls.Config(), [FeatureConfig("a", "a"), FeatureConfig("b", "b")])
    assert [f.table for f in features] == ["a", "b"] and sources == (("column", 0), ("column", 1))


def test_logit_is_bias_plus_id_weights_plus_linear_numerical():
    from tf_dlrm.sharding.plan import TableSpec
    from tests.plan_layer import plan_layer
    from tf_dlrm.sharding.planner import make_plan
    from tf_dlrm.models.logistic_regression import LogisticRegression

    plan = make_plan([TableSpec("a", 10, 1), TableSpec("b", 7, 1)], 1, "table_wise")
    model = LogisticRegression(plan_layer(plan, name="embedding"), num_numerical=3, seed=1)
    model.build(None)
    rng = np.random.default_rng(0)
    tables = [rng.normal(size=(10, 1)).astype(np.float32), rng.normal(size=(7, 1)).astype(np.float32)]
    for index, table in enumerate(tables):
        model.embedding.set_full_table(index, table)
    v, b = rng.normal(size=(3, 1)).astype(np.float32), np.float32(0.25)
    model.numerical_term.kernel.assign(v)
    model.ids_term.bias.assign([b])
    numerical = rng.normal(size=(5, 3)).astype(np.float32)
    a, c = rng.integers(0, 10, 5).astype(np.int32), rng.integers(0, 7, 5).astype(np.int32)
    logits = model({"numerical": numerical, "a": a, "b": c}).numpy()
    expected = b + tables[0][a, 0] + tables[1][c, 0] + numerical @ v[:, 0]
    np.testing.assert_allclose(logits[:, 0], expected, rtol=1e-6, atol=1e-6)
    clone = LogisticRegression.from_config(model.get_config())
    assert clone.num_numerical == 3 and clone.embedding.plan.tables == plan.tables


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return make_synthetic_small(tmp_path_factory.mktemp("lr_data"), seed=3, num_train=40_000, num_valid=10_000)


def final(log) -> dict:
    lines = [json.loads(line) for line in open(log, encoding="utf-8").read().splitlines()]
    assert lines[-1]["event"] == "final"
    return lines[-1]


FLAGS = ["--model=logistic_regression", "--batch_size=512", "--valid_batch_size=2048", f"--max_steps={STEPS}",
         "--embedding_optimizer=adagrad", "--embedding_learning_rate=0.1", "--learning_rate=0.05", "--seed=2"]


@pytest.mark.multirank
def test_trains_through_main_on_one_and_two_ranks(synthetic, tmp_path):
    """Synthetic labels come from first-order terms among others (tf_dlrm.data.synthetic): a linear
    model on the ids learns them, far above chance; two ranks train the same model (AUC within 1e-3)."""
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    run_python(["main.py", f"--dataset_path={synthetic}", f"--log_path={one}", *FLAGS])
    launch(2, ["main.py", f"--dataset_path={synthetic}", f"--log_path={two}", *FLAGS])
    first, second = final(one), final(two)
    assert first["steps"] == second["steps"] == STEPS
    assert first["auc"] > 0.6, first
    assert abs(first["auc"] - second["auc"]) <= 1e-3, (first, second)
    config = json.loads(open(one, encoding="utf-8").readline())
    assert {table["dim"] for table in config["plan"]["tables"]} == {1}, config["plan"]["tables"]
