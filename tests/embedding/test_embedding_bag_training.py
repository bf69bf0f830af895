"""Training steps through the embedding-bag kernel equal the plain TensorFlow path, for every sparse
optimizer: the kernel's gradient arrives summed per distinct row, and the sparse update skips its own
deduplication for such variables (tf_dlrm/embedding/sparse_update.py); a wrong skip would count a
duplicated row twice in Adagrad's or Adam's state, or not at all."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tf_dlrm.embedding.table_config import FeatureConfig
from tf_dlrm.embedding import distributed_embedding as embedding_module
from tf_dlrm.embedding import DistributedEmbedding
from tf_dlrm.ops.embedding_bag import bag_kernel, distinct_rows
from tf_dlrm.parallel.env import DistributedEnv
from tf_dlrm.sharding.plan import TableSpec
from tf_dlrm.sharding.planner import make_plan
from tf_dlrm.models.dlrm import DLRM
from tf_dlrm.optimizers.settings import LearningRateSchedule
from tf_dlrm.optimizers.settings import OptimizerConfig
from tf_dlrm.train.step import Trainer
from tests.plan_layer import plan_layer

TABLES = [TableSpec("items", 30, 8), TableSpec("tags", 12, 8), TableSpec("users", 50, 8), TableSpec("small", 4, 8)]
FEATURES = [
    FeatureConfig("clicks", "items", hotness=5, combiner="sum"),
    FeatureConfig("history", "items", hotness=6, combiner="mean", ragged=True),  # shares a table
    FeatureConfig("tags", "tags", hotness=3, combiner="sqrtn"),
    FeatureConfig("user", "users"),
    FeatureConfig("bucket", "small", hotness=2, combiner="mean", ragged=True),  # replicated table
]
BATCH = 16


def batches(count=3):
    """``(features, label)`` pairs: ``features`` holds ``"numerical"`` and the ids of every feature by name."""
    rng = np.random.default_rng(7)
    out = []
    for _ in range(count):
        numerical = rng.random((BATCH, 4), dtype=np.float32)
        # Few rows and many ids: duplicates within samples and across the batch.
        ragged = lambda rows, hotness: tf.ragged.constant(  # noqa: E731
            [list(rng.integers(0, rows, rng.integers(0, hotness + 1))) for _ in range(BATCH)], dtype=tf.int32)
        ids = (rng.integers(0, 30, (BATCH, 5)).astype(np.int32), ragged(30, 6),
               rng.integers(0, 12, (BATCH, 3)).astype(np.int32), rng.integers(0, 50, BATCH).astype(np.int32), ragged(4, 2))
        features = {"numerical": tf.constant(numerical), **{feature.name: i for feature, i in zip(FEATURES, ids)}}
        out.append((features, tf.constant(rng.integers(0, 2, (BATCH, 1)).astype(np.float32))))
    return out


def train(optimizer: str, kernel: bool, monkeypatch):
    with monkeypatch.context() as patch:
        if not kernel:
            patch.setattr(embedding_module, "bag_kernel", lambda: None)
        plan = make_plan(TABLES, 1, data_parallel_threshold=5)
        layer = plan_layer(plan, features=FEATURES, seed=3, name="embedding")
        model = DLRM(layer, 4, bottom_mlp_dims=(16, 8), top_mlp_dims=(8, 1), interaction="cat")
        data = batches()
        model(data[0][0])
    marked = [distinct_rows(v) for v in layer.shard_variables + layer.replicated_variables]
    config = OptimizerConfig(LearningRateSchedule(1.0), optimizer="sgd", embedding_optimizer=optimizer)
    trainer = Trainer(model, DistributedEnv(), config)
    initial = [v.numpy() for v in layer.shard_variables + layer.replicated_variables]
    for features, label in data:
        trainer.train_step(features, label)
    # What training changed (the initial tables are equal in both runs: same seed).
    return [v.numpy() - start for v, start in zip(layer.shard_variables + layer.replicated_variables, initial)], marked


@pytest.mark.skipif(bag_kernel() is None, reason="the kernel library is not built")
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad", "lazy_adam", "ftrl", "catch_up_adam", "dense_adam"])
def test_kernel_steps_equal_the_tensorflow_path(optimizer, monkeypatch):
    with_kernel, marked = train(optimizer, True, monkeypatch)
    without, unmarked = train(optimizer, False, monkeypatch)
    assert any(marked) and not any(unmarked)
    for ours, theirs in zip(with_kernel, without):
        scale = np.abs(theirs).max()
        assert scale > 0  # the tables trained
        # The two paths sum a row's gradients in another order: float32 roundoff of the updates
        # (about 1e-7 of them per sum, a few sums per step, three steps), far below 1e-4 of the
        # largest update; a gradient counted twice or scaled wrongly for some rows is off by far more.
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-4 * scale)


def test_without_the_library_the_layer_pools_with_tensorflow_ops():
    """``TF_DLRM_DISABLE_KERNELS=1`` (or no library): the plain path, nothing marked, same values."""
    code = (
        "import numpy as np, tensorflow as tf\n"
        "from tf_dlrm.embedding import DistributedEmbedding, FeatureConfig, TableConfig\n"
        "from tf_dlrm.ops.embedding_bag import distinct_rows\n"
        "items = TableConfig('items', 30, 4, initializer='uniform_sqrt_rows')\n"
        "layer = DistributedEmbedding([FeatureConfig('f', items, hotness=3, combiner='mean')], seed=2)\n"
        "out = layer({'f': np.array([[1, 1, 2], [29, 0, 0]], np.int32)}, stacked=True)\n"
        "print(layer.group_kernel, [distinct_rows(v) for v in layer.shard_variables], np.round(out.numpy().sum(), 5))\n")
    results = []
    for environment in ({"TF_DLRM_DISABLE_KERNELS": "1"}, {}):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **environment})
        assert done.returncode == 0, done.stderr
        results.append(done.stdout.strip().splitlines()[-1])
    disabled, enabled = results
    assert disabled.startswith("[False] [False]") and enabled.startswith("[True] [True]")
    assert disabled.split("] ")[-1] == enabled.split("] ")[-1]  # the same pooled values


def test_use_kernel_false_keeps_the_tensorflow_path_and_is_serialised():
    plan = make_plan(TABLES, 1, data_parallel_threshold=5)
    layer = plan_layer(plan, features=FEATURES, use_kernel=False)
    layer.build()
    assert not layer.single_op and not any(layer.group_kernel) and not layer.kernel_checked_features
    assert not any(distinct_rows(v) for v in layer.shard_variables + layer.replicated_variables)
    assert DistributedEmbedding.from_config(layer.get_config()).use_kernel is False
