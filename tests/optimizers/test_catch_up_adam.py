"""Catch-up Adam and dense Adam against dense Adam in numpy (float64).

An ``[8, 3]`` table trains for 60 steps; each row is touched on its own pattern (row 0 every step,
row 7 once in the middle, the others with gaps of 1 to 40 steps), and every row is touched at the
last step. Dense Adam (numpy, the formula Keras's ``Adam`` runs on a plain embedding) moves every row
at every step; catch-up Adam moves a row only when it is touched, first by the closed-form effect of
the zero-gradient steps it skipped. After the last step both tables must agree.

Tolerance: float32 against float64 over 60 steps. Each step rounds a weight of size up to ~4 once and
computes its move (size <= lr * 10) in a handful of float32 operations, so the error grows by at most
about ``8 u max(|w|, 1)`` per step (u = 2**-24): ``60 * 8 * u * 4 ~ 1.1e-4``. The one approximation of
the closed form (eps scaled by ``beta_2^(i/2)``, see the module) changes a skipped move by below
``eps * 0.1 / sqrt(v)``, with ``sqrt(v) >= 1e-3`` here: ``1e-6`` relative, far below. A wrong catch-up
(missing, one step off, undecayed moments) moves rows by more than 1e-3; lazy Adam by ~0.1 (checked).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tf_dlrm.parallel.env import DistributedEnv
from tf_dlrm.embedding.variable_kind import SliceLayout, set_layout
from tf_dlrm.optimizers import catch_up_adam
from tf_dlrm.optimizers.catch_up_adam import SparseCatchUpAdam, skipped_step_tails
from tf_dlrm.optimizers.dense_adam import SparseDenseAdam
from tf_dlrm.optimizers.lazy_adam import SparseLazyAdam
from tf_dlrm.embedding.sparse_update import SparseUpdater

ROWS, WIDTH, STEPS, RATE = 8, 3, 60, 0.05
BETA_1, BETA_2, EPSILON = 0.9, 0.999, 1e-8
UNIT_ROUNDOFF = 2.0**-24
TOLERANCE = STEPS * 8 * UNIT_ROUNDOFF * 4


def touch_pattern() -> list[np.ndarray]:
    """The ids looked up at each step (repeats included: row 0 twice every step)."""
    gaps = {1: 1, 2: 2, 3: 5, 4: 13, 5: 40, 6: 3}
    steps = []
    for t in range(1, STEPS + 1):
        ids = [0, 0] + [row for row, gap in gaps.items() if t % gap == 0]
        if t == STEPS // 2:
            ids.append(7)
        if t == STEPS:
            ids = list(range(ROWS))
        steps.append(np.array(ids, np.int32))
    return steps


def dense_adam_reference(initial, touched, gradients, weight_decay=0.0, decayed="every"):
    """Dense Adam in float64; ``weight_decay`` added to the gradient of every row (``decayed="every"``, as an L2
    loss over the table gives it) or of the touched rows only (``"touched"``)."""
    w, m, v = initial.astype(np.float64), np.zeros(initial.shape), np.zeros(initial.shape)
    for t, (ids, values) in enumerate(zip(touched, gradients), start=1):
        g = np.zeros(w.shape)
        np.add.at(g, ids, values)  # untouched rows: a zero gradient, and they still move
        rows = slice(None) if decayed == "every" else np.unique(ids)
        g[rows] += weight_decay * w[rows]
        m = BETA_1 * m + (1 - BETA_1) * g
        v = BETA_2 * v + (1 - BETA_2) * g**2
        w -= RATE * np.sqrt(1 - BETA_2**t) / (1 - BETA_1**t) * m / (np.sqrt(v) + EPSILON)
    return w, m, v


def train(optimizer, initial, touched, gradients, weight_decay=0.0):
    variable = set_layout(tf.Variable(initial), SliceLayout([0], [(0, WIDTH)], [WIDTH]))
    updater = SparseUpdater(optimizer, DistributedEnv(), [variable], [], weight_decay=weight_decay)
    for step, (ids, values) in enumerate(zip(touched, gradients), start=1):
        gradient = tf.IndexedSlices(tf.constant(values), tf.constant(ids), tf.constant([ROWS, WIDTH]))
        updater.apply([gradient], [], tf.constant(RATE), tf.constant(step, tf.int64), global_batch=len(ids))
    return variable.numpy(), {name: updater.slot(variable, name).numpy() for name in updater.slot_names}


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(11)
    initial = rng.uniform(-0.05, 0.05, size=(ROWS, WIDTH)).astype(np.float32)
    touched = touch_pattern()
    gradients = [rng.normal(size=(len(ids), WIDTH)).astype(np.float32) for ids in touched]
    return initial, touched, gradients, dense_adam_reference(initial, touched, gradients)


@pytest.mark.parametrize("path", ["kernel", "tensorflow_ops"])
def test_catch_up_equals_dense_adam_once_every_row_is_touched(problem, path, monkeypatch):
    if path == "kernel" and catch_up_adam.bag_kernel() is None:
        pytest.skip("the kernel library is not built")
    if path == "tensorflow_ops":
        monkeypatch.setattr(catch_up_adam, "bag_kernel", lambda: None)
    initial, touched, gradients, (w, m, v) = problem
    actual, state = train(SparseCatchUpAdam(BETA_1, BETA_2, EPSILON), initial, touched, gradients)
    np.testing.assert_allclose(actual, w, rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(state["m"], m, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(state["v"], v, rtol=1e-5, atol=1e-9)
    np.testing.assert_array_equal(state["last_step"], np.full((ROWS, WIDTH), STEPS, np.float32))


def test_lazy_adam_differs_from_dense_adam_on_this_problem(problem):
    """The test above can fail: without the catch-up the rows with gaps end far from dense Adam's."""
    initial, touched, gradients, (w, _, _) = problem
    actual, _ = train(SparseLazyAdam(BETA_1, BETA_2, EPSILON), initial, touched, gradients)
    assert np.abs(actual - w).max() > 1000 * TOLERANCE


@pytest.mark.parametrize("path", ["kernel", "tensorflow_ops"])
def test_catch_up_moves_only_the_touched_rows(problem, path, monkeypatch):
    if path == "tensorflow_ops":
        monkeypatch.setattr(catch_up_adam, "bag_kernel", lambda: None)
    initial, touched, gradients, _ = problem
    actual, state = train(SparseCatchUpAdam(BETA_1, BETA_2, EPSILON), initial, touched[:3], gradients[:3])
    never = sorted(set(range(ROWS)) - set(np.concatenate(touched[:3]).tolist()))
    assert never, "the first steps should leave some rows untouched"
    np.testing.assert_array_equal(actual[never], initial[never])
    assert not state["m"][never].any() and not state["last_step"][never].any()


def test_dense_adam_equals_dense_adam_on_every_row(problem):
    initial, touched, gradients, (w, m, v) = problem
    # Up to the step before the last, where rows 3..7 have pending moves under lazy semantics.
    reference = dense_adam_reference(initial, touched[:-1], gradients[:-1])
    actual, state = train(SparseDenseAdam(BETA_1, BETA_2, EPSILON), initial, touched[:-1], gradients[:-1])
    np.testing.assert_allclose(actual, reference[0], rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(state["m"], reference[1], rtol=1e-5, atol=1e-7)


def test_dense_adam_decays_every_row_as_keras_adam_under_an_l2_loss(problem):
    """``--embedding_weight_decay`` under dense Adam reaches every row at every step, not only the touched
    ones: rows 3..7, untouched for up to 40 steps, are pulled toward zero by the decay alone."""
    initial, touched, gradients, _ = problem
    decay = 0.5
    w, m, _ = dense_adam_reference(initial, touched[:-1], gradients[:-1], weight_decay=decay)
    touched_only, _, _ = dense_adam_reference(initial, touched[:-1], gradients[:-1], weight_decay=decay, decayed="touched")
    assert np.abs(touched_only - w).max() > 1000 * TOLERANCE, "the problem should tell the two decays apart"
    actual, state = train(SparseDenseAdam(BETA_1, BETA_2, EPSILON), initial, touched[:-1], gradients[:-1], weight_decay=decay)
    np.testing.assert_allclose(actual, w, rtol=0, atol=TOLERANCE)
    # m now averages decay * w, whose w carries the weights' own error (at most TOLERANCE).
    np.testing.assert_allclose(state["m"], m, rtol=1e-5, atol=decay * TOLERANCE)


def test_a_whole_variable_decay_is_refused_beside_another_optimizers_tables():
    """Two tables of one width share a variable; dense Adam's decay of every row would reach the SGD table's."""
    from tf_dlrm.embedding import DistributedEmbedding, FeatureConfig, TableConfig, optimizers
    from tf_dlrm.embedding.training_step import table_optimizer_groups

    def updater(weight_decay, other):
        tables = [TableConfig("a", 30, 4, optimizer=optimizers.DenseAdam(learning_rate=0.01)),
                  TableConfig("b", 30, 4, optimizer=other)]
        layer = DistributedEmbedding([FeatureConfig("a", tables[0]), FeatureConfig("b", tables[1])])
        layer.build()
        base, per_table, _ = table_optimizer_groups([layer])
        return SparseUpdater(base, DistributedEnv(), layer.sparse_variables, layer.replicated_variables,
                             layer.padding_variables, weight_decay=weight_decay, table_optimizers=per_table)

    with pytest.raises(ValueError, match=r"tables of dense_adam alone .* --embedding_weight_decay .* \['dense_adam', 'sgd'\]"):
        updater(0.01, optimizers.SGD(learning_rate=0.1))
    updater(0.0, optimizers.SGD(learning_rate=0.1))  # no decay: each optimizer moves its own rows
    updater(0.01, optimizers.DenseAdam(learning_rate=0.01))  # one optimizer: its variable is its own


def test_skipped_step_tails_match_a_direct_sum():
    tails = skipped_step_tails(BETA_1, BETA_2)
    ratio = BETA_1 / np.sqrt(BETA_2)
    terms = np.arange(1, 2000, dtype=np.float64)
    for start in (0, 1, 7, 500, 5000):
        j = start + terms
        direct = np.sum(np.sqrt(1 - BETA_2**j) / (1 - BETA_1**j) * ratio**terms)
        np.testing.assert_allclose(tails[min(start, len(tails) - 1)], direct, rtol=1e-12)
    assert tails[-1] == pytest.approx(ratio / (1 - ratio), rel=1e-15)


def test_bad_betas_are_refused_naming_them():
    with pytest.raises(ValueError, match=r"beta_1=0.9, beta_2=0.5"):
        SparseCatchUpAdam(beta_1=0.9, beta_2=0.5)


def test_one_optimizer_serves_two_traced_functions():
    """The same optimizer object is traced into two ``tf.function`` graphs (a train step and, e.g., a
    hot-row merge): a tensor cached from the first trace would be refused by the second."""
    optimizer = SparseCatchUpAdam(BETA_1, BETA_2, EPSILON)
    tables = [tf.Variable(tf.zeros([ROWS, WIDTH])) for _ in range(2)]
    slots = [optimizer.create_slots(table) for table in tables]
    for table, state in zip(tables, slots):
        update = tf.function(lambda t=table, s=state: optimizer.apply(
            t, s, tf.constant([1, 3], tf.int64), tf.ones([2, WIDTH]), tf.constant(RATE), tf.constant(2, tf.int64)))
        update()
        assert np.abs(table.numpy()[[1, 3]]).min() > 0 and not table.numpy()[[0, 2]].any()
