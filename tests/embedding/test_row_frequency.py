"""The frequency regularizer on a tiny table: a row seen once against a row seen at every step.

A ``[4, 2]`` table, plain SGD at rate 0.5, and numpy's float64 arithmetic of the same few
multiply-adds per step: float32 rounding (2**-24 of values of order 1, a handful of times) stays far
below the 1e-6 tolerance, while any wrong count or a missed gate changes a row by a tenth or more.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tf_dlrm.embedding import FrequencyRegularizer, TableConfig
from tf_dlrm.embedding.row_frequency import COUNT_SLOT
from tf_dlrm.embedding.sparse_update import SparseUpdater
from tf_dlrm.embedding.variable_kind import SliceLayout, VariableKind, mark, set_layout
from tf_dlrm.optimizers.sparse_sgd import SparseSGD
from tf_dlrm.parallel.env import DistributedEnv

RATE, BATCH = 0.5, 4
INITIAL = np.array([[1.0, -2.0], [0.5, 1.5], [3.0, 1.0], [-1.0, 2.0]], np.float32)
# Row 1 is looked up at every step (twice in the first), row 2 only at the first, row 3 only at the third.
STEPS = [[1, 1, 2], [1], [1, 3]]


def train(regularizer: FrequencyRegularizer, gradient: float = 0.0):
    """Three steps; every looked-up id brings ``gradient`` to each element of its row."""
    variable = set_layout(mark(tf.Variable(INITIAL), VariableKind.SHARDED), SliceLayout([0], [(0, 2)], [2]))
    updater = SparseUpdater(SparseSGD(), DistributedEnv(), [variable], [], frequency_regularizer=regularizer)
    for step, ids in enumerate(STEPS, start=1):
        values = tf.fill([len(ids), 2], tf.constant(gradient, tf.float32))
        updater.apply([tf.IndexedSlices(values, tf.constant(ids, tf.int32), tf.constant([4, 2]))], [],
                      tf.constant(RATE), tf.constant(step, tf.int64), global_batch=BATCH)
    return variable.numpy(), updater.slot(variable, COUNT_SLOT).numpy()[:, 0]


def test_counts_are_steps_that_looked_a_row_up():
    _, counts = train(FrequencyRegularizer(l2=0.1))
    np.testing.assert_array_equal(counts, [0, 3, 1, 1])  # row 1's two lookups in step 1 count once


def test_l2_pulls_a_rare_row_harder_than_a_frequent_one():
    l2 = 0.8
    actual, _ = train(FrequencyRegularizer(l2=l2))
    l2 /= BATCH  # one sample's share: the loss is a mean over the global batch
    expected = INITIAL.astype(np.float64)
    for count in (1, 2, 3):  # row 1: its penalty falls as l2 / count
        expected[1] *= 1 - RATE * l2 / count
    expected[2] *= 1 - RATE * l2  # seen once: the full penalty at its one touch
    expected[3] *= 1 - RATE * l2
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)
    # Per touch, the row seen once shrank by l2 * RATE; row 1 at its third touch by a third of that.
    assert 1 - actual[2, 0] / INITIAL[2, 0] == pytest.approx(RATE * l2, rel=1e-5)


def test_min_count_keeps_rows_seen_fewer_times_as_they_were():
    actual, counts = train(FrequencyRegularizer(min_count=2), gradient=1.0)
    expected = INITIAL.astype(np.float64)
    expected[1] -= RATE * 1.0 * 2  # steps 2 and 3 (count 2, 3); step 1 (count 1) is dropped
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(actual[2:], INITIAL[2:])  # seen once: never updated
    np.testing.assert_array_equal(actual[0], INITIAL[0])  # never seen
    np.testing.assert_array_equal(counts, [0, 3, 1, 1])


@pytest.mark.parametrize("arguments,message", [
    ({"l2": -0.1}, "Expected l2 >= 0 for a frequency regularizer. Received: l2=-0.1"),
    ({"min_count": 0}, "Expected min_count to be a positive integer for a frequency regularizer. Received: min_count=0"),
])
def test_bad_settings_are_refused_with_their_name(arguments, message):
    with pytest.raises(ValueError) as error:
        FrequencyRegularizer(**arguments)
    assert str(error.value) == message


def test_table_config_carries_it_and_drops_an_inactive_one():
    table = TableConfig("ads", 10, 4, frequency_regularizer={"l2": 0.1, "min_count": 2})
    assert table.frequency_regularizer == FrequencyRegularizer(l2=0.1, min_count=2)
    assert TableConfig.from_dict(table.to_dict()).frequency_regularizer == table.frequency_regularizer
    assert TableConfig("ads", 10, 4, frequency_regularizer=FrequencyRegularizer()).frequency_regularizer is None
