"""The distributed embedding's id inputs in one process: pooling against hand-computed sums, and
every bad input (more ids than hotness, id >= rows, a -1 pad id, an empty ragged row) named."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tf_dlrm.embedding import DistributedEmbedding
from tf_dlrm.sharding.plan import TableSpec
from tf_dlrm.sharding.planner import make_plan
from tf_dlrm.embedding.table_config import FeatureConfig
from tests.plan_layer import plan_layer

FEATURES = [
    FeatureConfig("clicks", "items", hotness=3, combiner="sum"),
    FeatureConfig("history", "items", hotness=4, combiner="mean", ragged=True),
    FeatureConfig("device", "devices"),
    FeatureConfig("tags", "devices", hotness=2, combiner="sqrtn"),
]


def make_layer(**kwargs):
    plan = make_plan([TableSpec("items", 40, 6), TableSpec("devices", 5, 3)], 1, data_parallel_threshold=10)
    layer = plan_layer(plan, features=FEATURES, seed=4, **kwargs)
    layer.build()
    return layer


def inputs(history=None, clicks=None):
    clicks = np.array([[1, 1, 7], [0, 2, 39]], np.int32) if clicks is None else clicks
    history = tf.ragged.constant([[3, 3], []], dtype=tf.int32) if history is None else history
    return {"clicks": clicks, "history": history, "device": np.array([4, 0], np.int32),
            "tags": np.array([[1, 2], [2, 2]], np.int32)}


def table(layer, name):
    index = [t.name for t in layer.plan.tables].index(name)
    return layer.get_full_table(index)


def test_pooled_outputs_match_hand_sums():
    layer = make_layer()
    out = layer(inputs(), local_batch=2, stacked=True).numpy()
    items, devices = table(layer, "items"), table(layer, "devices")
    assert out.shape == (2, 6 + 6 + 3 + 3)  # mixed widths: flat, feature by feature
    expected = np.concatenate([
        items[[1, 1, 7]].sum(0), items[[3, 3]].mean(0), devices[4], (devices[1] + devices[2]) / np.sqrt(2),
    ])
    np.testing.assert_allclose(out[0], expected, rtol=1e-6)
    # An empty ragged row pools to zeros under mean (no 0/0).
    np.testing.assert_array_equal(out[1, 6:12], np.zeros(6))
    split = layer.split_features(out)
    assert list(split) == ["clicks", "history", "device", "tags"] and split["device"].shape == (2, 3)


def test_gradient_reaches_every_id_with_duplicates_accumulated():
    layer = make_layer()
    with tf.GradientTape() as tape:
        out = layer(inputs(), local_batch=2, stacked=True)
        loss = tf.reduce_sum(out[:, :6]) + 2.0 * tf.reduce_sum(out[:, 6:12])
    gradient = tape.gradient(loss, layer.shard_variables[0].value)
    dense = tf.math.unsorted_segment_sum(gradient.values, gradient.indices, 40).numpy()
    # clicks (sum): id 1 twice, 7, 0, 2, 39 once; history (mean of [3, 3]): 2 * 2 * 1/2 to id 3.
    expected = np.zeros(40)
    for row, count in {1: 2, 7: 1, 0: 1, 2: 1, 39: 1}.items():
        expected[row] += count
    expected[3] += 2.0
    np.testing.assert_allclose(dense, np.repeat(expected[:, None], 6, axis=1), rtol=1e-6)


def test_more_ids_than_hotness_is_refused_naming_the_feature():
    layer = make_layer()
    with pytest.raises(ValueError, match="'clicks' has hotness 3.*Received: shape=\\(2, 4\\)"):
        layer(inputs(clicks=np.zeros((2, 4), np.int32)), local_batch=2)
    too_long = tf.ragged.constant([[1, 2, 3, 4, 5], [1]], dtype=tf.int32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="'history': a sample has more ids than its hotness 4"):
        layer(inputs(history=too_long), local_batch=2)


@pytest.mark.parametrize("bad_id", [40, -1])
def test_id_outside_the_table_is_refused_naming_the_feature(bad_id):
    layer = make_layer()
    clicks = np.array([[1, 1, 7], [0, bad_id, 3]], np.int32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"'clicks': an id is outside \[0, 40\)"):
        layer(inputs(clicks=clicks), local_batch=2)
    history = tf.ragged.constant([[bad_id], []], dtype=tf.int32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"'history': an id is outside \[0, 40\)"):
        layer(inputs(history=history), local_batch=2)


def test_dense_ids_for_a_ragged_feature_of_fewer_columns_are_accepted():
    """A ragged feature may also come dense with at most ``hotness`` ids per sample (no empty rows)."""
    layer = make_layer()
    ragged = layer(inputs(history=tf.ragged.constant([[3, 5], [1, 2]], dtype=tf.int32)), local_batch=2, stacked=True)
    dense = layer(inputs(history=np.array([[3, 5], [1, 2]], np.int32)), local_batch=2, stacked=True)
    np.testing.assert_array_equal(ragged.numpy(), dense.numpy())
