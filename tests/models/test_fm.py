"""--model=fm: found by the registry, the logit it computes against numpy, and training through main.py (one
process and two ranks, the same model) to an AUC above logistic regression's on the same data."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import launch, make_synthetic_small, run_python

STEPS = 60


def test_logit_is_bias_plus_id_weights_plus_scaled_pairwise_dots_plus_numerical():
    from tests.model_families import build_family_model
    from tf_dlrm.embedding.table_config import FeatureConfig, TableConfig
    from tf_dlrm.models import registry
    from tf_dlrm.sharding.planner import make_plan

    assert registry.reference_of(registry.lookup("fm")) == "fm"
    base = [TableConfig("a", 10, 4), TableConfig("b", 7, 4), TableConfig("c", 5, 4)]
    _, model = build_family_model("fm", {}, base, [FeatureConfig(t.name, t.name) for t in base], (),
                                  lambda tables: make_plan(tables, 1, "table_wise"), num_numerical=2, rank=0, seed=1)
    model.build(None)
    rng = np.random.default_rng(0)
    vectors = [rng.normal(size=(t.vocabulary_size, 4)).astype(np.float32) for t in base]
    weights = [rng.normal(size=(t.vocabulary_size, 1)).astype(np.float32) for t in base]
    for index, table in enumerate(vectors + weights):  # the deep tables, then linear:a, linear:b, linear:c
        model.embedding.set_full_table(index, table)
    u, bias = rng.normal(size=(2, 1)).astype(np.float32), np.float32(0.5)
    model.numerical_term.kernel.assign(u)
    model.first_order.bias.assign([bias])
    numerical = rng.normal(size=(6, 2)).astype(np.float32)
    ids = {t.name: rng.integers(0, t.vocabulary_size, 6).astype(np.int32) for t in base}
    logits = model({"numerical": numerical, **ids}).numpy()[:, 0]
    v = [table[ids[t.name]] for table, t in zip(vectors, base)]  # [6, 4] each
    pairwise = sum((v[i] * v[j]).sum(axis=1) for i in range(3) for j in range(i + 1, 3)) / np.sqrt(4)
    expected = bias + sum(w[ids[t.name], 0] for w, t in zip(weights, base)) + pairwise + numerical @ u[:, 0]
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return make_synthetic_small(tmp_path_factory.mktemp("fm_data"), seed=3, num_train=40_000, num_valid=10_000)


def final(log) -> dict:
    lines = [json.loads(line) for line in open(log, encoding="utf-8").read().splitlines()]
    assert lines[-1]["event"] == "final"
    return lines[-1]


FLAGS = ["--batch_size=512", "--valid_batch_size=2048", f"--max_steps={STEPS}", "--embedding_dim=8", "--seed=2"]


@pytest.mark.multirank
def test_trains_through_main_on_one_and_two_ranks_above_logistic_regression(synthetic, tmp_path):
    """Synthetic labels hold pairwise terms (tf_dlrm.data.synthetic): the FM learns more of them than a linear
    model in the same steps; two ranks train the same model (AUC within 1e-3)."""
    one, two, linear = tmp_path / "one.jsonl", tmp_path / "two.jsonl", tmp_path / "linear.jsonl"
    run_python(["main.py", f"--dataset_path={synthetic}", f"--log_path={one}", "--model=fm", *FLAGS])
    launch(2, ["main.py", f"--dataset_path={synthetic}", f"--log_path={two}", "--model=fm", *FLAGS])
    run_python(["main.py", f"--dataset_path={synthetic}", f"--log_path={linear}", "--model=logistic_regression", *FLAGS])
    first, second, baseline = final(one), final(two), final(linear)
    assert first["steps"] == second["steps"] == STEPS
    assert abs(first["auc"] - second["auc"]) <= 1e-3, (first, second)
    assert first["auc"] > baseline["auc"], (first, baseline)
