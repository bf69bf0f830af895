"""Each optimizer against a few lines of numpy on a tiny problem (repeated ids in every batch).

A ``[6, 3]`` table takes three steps of gradients for ids ``[1, 4, 1, 1, 0]`` (row 1 three times):
the optimizer must see row 1's *summed* gradient once per step, as one process does. Tolerance:
float32 against float64 numpy over three steps, each a handful of flops on values of order 1:
a few unit roundoffs (2**-24 ~ 6e-8) each, so 1e-6 relative leaves ample room and still fails
for any wrong formula (a missed sum of repeats changes row 1 by tens of percent). LAMB: 1e-5, as its
trust ratio divides two norms (sums of 12 squares) and multiplies the step by their ratio.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_dlrm.parallel.env import DistributedEnv
from tf_dlrm.embedding.variable_kind import SliceLayout, set_layout
from tf_dlrm.optimizers.lamb import Lamb
from tf_dlrm.optimizers.lazy_adam import SparseLazyAdam
from tf_dlrm.optimizers.rowwise_adagrad import SparseRowwiseAdagrad
from tf_dlrm.optimizers.sparse_adagrad import SparseAdagrad
from tf_dlrm.optimizers.sparse_sgd import SparseSGD
from tf_dlrm.embedding.sparse_update import SparseUpdater

IDS = np.array([1, 4, 1, 1, 0], np.int32)
RATE, DECAY = 0.05, 0.01


def run_updater(optimizer, steps: int = 3, weight_decay: float = 0.0):
    rng = np.random.default_rng(7)
    initial = rng.normal(size=(6, 3)).astype(np.float32)
    gradients = [rng.normal(size=(len(IDS), 3)).astype(np.float32) for _ in range(steps)]
    variable = set_layout(tf.Variable(initial), SliceLayout([0], [(0, 3)], [3]))
    updater = SparseUpdater(optimizer, DistributedEnv(), [variable], [], weight_decay=weight_decay)
    for step, values in enumerate(gradients, start=1):
        gradient = tf.IndexedSlices(tf.constant(values), tf.constant(IDS), tf.constant([6, 3]))
        updater.apply([gradient], [], tf.constant(RATE), tf.constant(step, tf.int64), global_batch=len(IDS))
    state = {name: updater.slot(variable, name).numpy() for name in updater.slot_names}
    return initial.astype(np.float64), gradients, variable.numpy(), state


def summed_rows(values):
    """numpy: the summed gradient of each touched row (``np.add.at`` accumulates the repeats)."""
    total = np.zeros((6, values.shape[1]))
    np.add.at(total, IDS, values)
    return np.unique(IDS), total


@pytest.mark.parametrize("weight_decay", [0.0, DECAY])
def test_sgd(weight_decay):
    w, gradients, actual, _ = run_updater(SparseSGD(), weight_decay=weight_decay)
    for values in gradients:
        rows, g = summed_rows(values)
        w[rows] -= RATE * (g[rows] + weight_decay * w[rows])
    np.testing.assert_allclose(actual, w, rtol=1e-6, atol=1e-6)


def test_adagrad():
    w, gradients, actual, state = run_updater(SparseAdagrad(initial_accumulator=0.1, epsilon=1e-7))
    accumulator = np.full_like(w, 0.1)
    for values in gradients:
        rows, g = summed_rows(values)
        accumulator[rows] += g[rows] ** 2
        w[rows] -= RATE * g[rows] / (np.sqrt(accumulator[rows]) + 1e-7)
    np.testing.assert_allclose(actual, w, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(state["accumulator"], accumulator, rtol=1e-6)


def test_rowwise_adagrad_with_weight_decay():
    w, gradients, actual, state = run_updater(SparseRowwiseAdagrad(initial_accumulator=0.1, epsilon=1e-7), weight_decay=DECAY)
    accumulator = np.full((6, 1), 0.1)
    for values in gradients:
        rows, g = summed_rows(values)
        g = g[rows] + DECAY * w[rows]
        accumulator[rows, 0] += (g**2).mean(axis=1)
        w[rows] -= RATE * g / (np.sqrt(accumulator[rows]) + 1e-7)
    assert state["accumulator"].shape == (6, 1)
    np.testing.assert_allclose(actual, w, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(state["accumulator"], accumulator, rtol=1e-6)


def test_lazy_adam_leaves_untouched_rows_alone():
    w, gradients, actual, state = run_updater(SparseLazyAdam(beta_1=0.9, beta_2=0.99, epsilon=1e-8))
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t, values in enumerate(gradients, start=1):
        rows, g = summed_rows(values)
        m[rows] = 0.9 * m[rows] + 0.1 * g[rows]
        v[rows] = 0.99 * v[rows] + 0.01 * g[rows] ** 2
        w[rows] -= RATE * np.sqrt(1 - 0.99**t) / (1 - 0.9**t) * m[rows] / (np.sqrt(v[rows]) + 1e-8)
    np.testing.assert_allclose(actual, w, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(state["m"], m, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(state["v"], v, rtol=1e-6, atol=1e-9)
    assert not state["m"][[2, 3, 5]].any(), "rows never looked up got state"


def test_lamb_trust_ratio_per_layer():
    rng = np.random.default_rng(3)
    kernel0, bias0 = rng.normal(size=(4, 3)), rng.normal(size=3) * 0.1
    gradients = [(rng.normal(size=(4, 3)), rng.normal(size=3)) for _ in range(3)]
    kernel, bias = keras.Variable(kernel0.astype(np.float32)), keras.Variable(bias0.astype(np.float32))
    optimizer = Lamb(learning_rate=RATE, beta_1=0.9, beta_2=0.99, epsilon=1e-6, weight_decay_rate=DECAY)
    for g_kernel, g_bias in gradients:
        optimizer.apply([tf.constant(g_kernel, tf.float32), tf.constant(g_bias, tf.float32)], [kernel, bias])
    expected = []
    for w, grads in ((kernel0.copy(), [g for g, _ in gradients]), (bias0.copy(), [g for _, g in gradients])):
        m, v = np.zeros_like(w), np.zeros_like(w)
        for t, g in enumerate(grads, start=1):
            m = 0.9 * m + 0.1 * g
            v = 0.99 * v + 0.01 * g**2
            update = (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.99**t)) + 1e-6) + DECAY * w
            w = w - RATE * np.linalg.norm(w) / np.linalg.norm(update) * update
        expected.append(w)
    np.testing.assert_allclose(kernel.numpy(), expected[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bias.numpy(), expected[1], rtol=1e-5, atol=1e-6)


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="beta_1=1.5"):
        SparseLazyAdam(beta_1=1.5)
    with pytest.raises(ValueError, match="initial_accumulator=-1"):
        SparseAdagrad(initial_accumulator=-1)


@pytest.mark.parametrize(
    "flags, dense, embedding",
    [
        ([], 0.001, 0.003),  # the tuned defaults
        (["--learning_rate=0.5"], 0.5, 0.5),  # an explicit --learning_rate drives every family
        (["--learning_rate=0.5", "--embedding_learning_rate=0.02"], 0.5, 0.02),  # a family's own flag wins
        # DeepFM's and Wide & Deep's embeddings default to their own rate with catch_up_adam (the default table
        # optimizer) and lazy_adam (their embedding_learning_rates) ...
        (["--model=deepfm"], 0.001, 0.01),
        (["--model=wide_deep"], 0.001, 0.01),
        (["--model=deepfm", "--embedding_optimizer=lazy_adam"], 0.001, 0.01),
        (["--model=wide_deep", "--embedding_optimizer=catch_up_adam"], 0.001, 0.01),
        (["--model=dcnv2"], 0.001, 0.003),
        # ... which neither an explicit rate, nor --learning_rate, nor another optimizer gets.
        (["--model=deepfm", "--embedding_learning_rate=0.002"], 0.001, 0.002),
        (["--model=wide_deep", "--learning_rate=0.5"], 0.5, 0.5),
        (["--model=deepfm", "--embedding_optimizer=adagrad"], 0.001, 0.003),
        (["--model=wide_deep", "--embedding_optimizer=dense_adam"], 0.001, 0.003),
    ],
)
def test_learning_rate_flags_give_each_family_its_rate(flags, dense, embedding):
    from tf_dlrm.cli import main as cli
    from tf_dlrm.cli.flags import config_from_flags

    cli.FLAGS.unparse_flags()
    cli.FLAGS(["main.py", "--dataset_path=/nonexistent", *flags])
    try:
        config = config_from_flags(cli.FLAGS).optimizer
    finally:
        cli.FLAGS.unparse_flags()
    base = config.schedule.base
    assert base * config.dense_rate_factor == pytest.approx(dense)
    assert base * config.embedding_rate_factor == pytest.approx(embedding)


@pytest.mark.parametrize("features, refused", [
    ([("a", "t0", 1), ("b", "t1", 1)], False),  # one one-hot feature per table: exact
    ([("a", "t0", 3), ("b", "t1", 1)], True),  # a multi-hot feature on a column-sliced table
    ([("a", "t0", 1), ("b", "t0", 1), ("c", "t1", 1)], True),  # a column-sliced table read twice
])
def test_rowwise_adagrad_refuses_what_it_cannot_keep_exact(features, refused):
    """Row-wise state of a column-sliced table sums each sample's partial squares over the slices:
    exact for one one-hot reader only, so anything else is refused by name before training."""
    from tf_dlrm.embedding.table_config import FeatureConfig
    from tf_dlrm.sharding.plan import TableSpec
    from tests.plan_layer import plan_layer
    from tf_dlrm.sharding.planner import make_plan

    plan = make_plan([TableSpec("t0", 40, 8), TableSpec("t1", 30, 8)], 2, "column_wise", data_parallel_threshold=1)
    layer = plan_layer(plan, rank=0, features=[FeatureConfig(n, t, h) for n, t, h in features])
    layer.build()
    env = DistributedEnv(rank=0, world_size=2)
    make = lambda: SparseUpdater(SparseRowwiseAdagrad(), env, layer.sparse_variables, [], layer.padding_variables)  # noqa: E731
    if refused:
        with pytest.raises(ValueError, match=r"^Row-wise optimizer rowwise_adagrad: row-wise optimizer state .* 't0'.* Keep the "
                                             r"table whole \(a plan from plan_tables"):
            make()
        SparseUpdater(SparseAdagrad(), env, layer.sparse_variables, [], layer.padding_variables)  # element-wise: fine
    else:
        make()
