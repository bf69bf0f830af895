"""DCNv2, DeepFM and Wide & Deep under ``--xla`` (equal to the plain step) and ``--amp`` (bf16 trains)."""

from __future__ import annotations

import numpy as np
import pytest

from tf_dlrm.spec.crossed_features import CrossedFeature
from tf_dlrm.embedding.table_config import FeatureConfig, TableConfig

CARDINALITIES = (40, 3000, 500, 7000)
CROSSED = [CrossedFeature("t1", "t2", 300)]
FAMILIES = {
    "dcnv2": {"model": "dcnv2", "num_cross_layers": 2, "cross_low_rank": 4, "deep_mlp_dims": (16,)},
    "dcnv2_parallel": {"model": "dcnv2", "num_cross_layers": 2, "cross_structure": "parallel", "deep_mlp_dims": (16,)},
    "deepfm": {"model": "deepfm", "deep_mlp_dims": (16,)},
    "wide_deep": {"model": "wide_deep", "deep_mlp_dims": (16,), "wide_optimizer": "ftrl"},
}


def family_model(name, policy="float32", seed=5):
    import keras

    from tf_dlrm.sharding.planner import make_plan
    from model_families import build_family_model
    from tf_dlrm.cli.builder import build_with_dummy_batch

    previous = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy(policy)
    try:
        params = dict(FAMILIES[name])
        model_name = params.pop("model")
        _, model = build_family_model(model_name, params, [TableConfig(f"t{i}", rows, 8) for i, rows in enumerate(CARDINALITIES)],
                                      [FeatureConfig(t, t) for t in ("t0", "t1", "t2", "t3")], CROSSED,
                                      lambda tables: make_plan(tables, 1, "auto", data_parallel_threshold=100), 5, 0, seed)
        build_with_dummy_batch(model, 5, model.embedding, 1)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    return model


def batches(count, size=64, seed=0):
    """``(features, label)`` batches: the numerical features and the ids of columns ``t0 .. t3`` by name."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        numerical = rng.random((size, 5), dtype=np.float32)
        ids = {f"t{i}": rng.integers(0, min(rows, 20), size).astype(np.int32) for i, rows in enumerate(CARDINALITIES)}
        out.append(({"numerical": numerical, **ids}, rng.integers(0, 2, (size, 1)).astype(np.float32)))
    return out


def optimizer_config():
    from tf_dlrm.optimizers.settings import LearningRateSchedule
    from tf_dlrm.optimizers.settings import OptimizerConfig

    return OptimizerConfig(LearningRateSchedule(0.5), optimizer="adam", embedding_optimizer="lazy_adam",
                           dense_learning_rate=0.01, embedding_learning_rate=0.05)


@pytest.mark.slow  # XLA compiles two models per case
@pytest.mark.parametrize("name", list(FAMILIES))
def test_xla_step_equals_the_plain_step(name):
    from tf_dlrm.parallel.env import DistributedEnv
    from tf_dlrm.train.step import Trainer

    plain, compiled = family_model(name), family_model(name)
    trainers = [Trainer(plain, DistributedEnv(), optimizer_config()), Trainer(compiled, DistributedEnv(), optimizer_config(), jit_compile=True)]
    data = batches(4)
    # As tests/train/test_amp_xla.py: float32 sums of at most 64 terms ordered differently,
    # gamma_64 = 3.8e-6 of values of order 1, hence 1e-5 absolute.
    for batch in data[:3]:
        losses = [float(t.train_step(*batch).numpy()) for t in trainers]
        assert abs(losses[0] - losses[1]) <= 1e-5, losses
    np.testing.assert_allclose(compiled(data[3][0]).numpy(), plain(data[3][0]).numpy(), rtol=0, atol=1e-5)
    for mine, theirs in zip(compiled.weights, plain.weights):
        np.testing.assert_allclose(np.asarray(mine), np.asarray(theirs), rtol=0, atol=1e-5, err_msg=mine.path)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_bfloat16_trains_with_float32_logits(name):
    from tf_dlrm.parallel.env import DistributedEnv
    from tf_dlrm.train.step import Trainer

    model = family_model(name, policy="mixed_bfloat16")
    assert model.compute_dtype == "bfloat16"
    trainer = Trainer(model, DistributedEnv(), optimizer_config())
    data = batches(20)
    losses = [float(trainer.train_step(*batch).numpy()) for batch in data]
    logits = model(data[0][0])
    assert logits.dtype == "float32" and np.isfinite(losses).all()
    # The same batches again: training on them lowered their loss.
    again = [float(trainer.train_step(*batch).numpy()) for batch in data[:5]]
    assert np.mean(again) < np.mean(losses[:5]), (losses[:5], again)
