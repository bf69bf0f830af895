"""Weighted features (a weight per id) and sequence features (no combiner) in one process: outputs against
hand-computed numbers and the reference :class:`EmbeddingBank`, gradients scaled by the weights and sent per id,
and bad weights named. N ranks against one process: tests/embedding/test_din_model.py."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tf_dlrm.embedding import DistributedEmbedding, FeatureConfig, TableConfig
from tf_dlrm.embedding.embedding_bank import EmbeddingBank

ITEMS = TableConfig("items", 30, 4, placement="table_wise")
TAGS = TableConfig("tags", 12, 6, placement="column_wise")
USERS = TableConfig("users", 9, 4, placement="replicated")


def features():
    return [
        FeatureConfig("history", ITEMS, hotness=3, ragged=True, combiner=None, weighted=True),
        FeatureConfig("clicks", ITEMS, hotness=3, ragged=True, combiner=None),
        FeatureConfig("tags", TAGS, hotness=4, ragged=True, combiner="mean", weighted=True),
        FeatureConfig("tag_sum", TAGS, hotness=2, combiner="sum", weighted=True),
        FeatureConfig("tag_sqrtn", TAGS, hotness=4, ragged=True, combiner="sqrtn", weighted=True),
        FeatureConfig("user", USERS, weighted=True),
        FeatureConfig("item", ITEMS),
    ]


def batch():
    ids = {
        "history": tf.ragged.constant([[3, 3, 7], [], [29]], dtype=tf.int64),
        "clicks": tf.ragged.constant([[1], [2, 5], []], dtype=tf.int64),
        "tags": tf.ragged.constant([[0, 1], [11], []], dtype=tf.int64),
        "tag_sum": tf.constant([[2, 2], [3, 4], [0, 11]], tf.int64),
        "tag_sqrtn": tf.ragged.constant([[5, 6, 7], [8], [9, 9]], dtype=tf.int64),
        "user": tf.constant([8, 0, 4], tf.int64),
        "item": tf.constant([3, 4, 5], tf.int64),
    }
    weights = {
        "history": tf.ragged.constant([[0.5, 2.0, 1.0], [], [3.0]]),
        "tags": tf.ragged.constant([[1.0, 3.0], [0.0], []]),
        "tag_sum": tf.constant([[1.0, -1.5], [2.0, 0.25], [4.0, 1.0]]),
        "tag_sqrtn": tf.ragged.constant([[1.0, 2.0, 2.0], [3.0], [1.0, 1.0]]),
        "user": tf.constant([2.0, 0.5, -1.0]),
    }
    return ids, weights


@pytest.fixture(scope="module", params=[True, False], ids=["kernel", "plain"])
def layer(request):
    layer = DistributedEmbedding(features(), seed=3, use_kernel=request.param)
    layer.build()
    return layer


def table(layer, name):
    return layer.get_full_table([t.name for t in layer.plan.tables].index(name))


def test_outputs_match_hand_computed_weighted_pools_and_padded_sequences(layer):
    ids, weights = batch()
    out = {k: v.numpy() for k, v in layer(ids, weights).items()}
    items, tags, users = table(layer, "items"), table(layer, "tags"), table(layer, "users")
    assert out["history"].shape == (3, 3, 4) and out["clicks"].shape == (3, 3, 4)
    np.testing.assert_allclose(out["history"][0], [0.5 * items[3], 2.0 * items[3], items[7]], rtol=1e-6)
    np.testing.assert_array_equal(out["history"][1], np.zeros((3, 4)))  # an empty history: zeros
    np.testing.assert_allclose(out["history"][2], [3.0 * items[29], np.zeros(4), np.zeros(4)], rtol=1e-6)
    np.testing.assert_allclose(out["clicks"][1], [items[2], items[5], np.zeros(4)], rtol=1e-6)
    np.testing.assert_allclose(out["tags"][0], (tags[0] + 3.0 * tags[1]) / 4.0, rtol=1e-6)
    np.testing.assert_array_equal(out["tags"][1:], np.zeros((2, 6)))  # weights summing to zero; no ids
    np.testing.assert_allclose(out["tag_sum"][0], -0.5 * tags[2], rtol=1e-5)
    np.testing.assert_allclose(out["tag_sum"][1], 2.0 * tags[3] + 0.25 * tags[4], rtol=1e-6)
    np.testing.assert_allclose(out["tag_sqrtn"][0], (tags[5] + 2 * tags[6] + 2 * tags[7]) / 3.0, rtol=1e-6)
    np.testing.assert_allclose(out["tag_sqrtn"][2], 2 * tags[9] / np.sqrt(2.0), rtol=1e-6)
    np.testing.assert_allclose(out["user"], [2.0 * users[8], 0.5 * users[0], -users[4]], rtol=1e-6)
    np.testing.assert_allclose(out["item"], items[[3, 4, 5]], rtol=1e-6)


def test_outputs_equal_the_reference_bank(layer):
    ids, weights = batch()
    names = [t.name for t in layer.plan.tables]
    bank = EmbeddingBank([t.rows for t in layer.plan.tables], [t.dim for t in layer.plan.tables],
                         features=[f.to_dict() | {"table": f.table_name} for f in features()], table_names=names)
    bank.build()
    for index in range(len(names)):
        bank.set_full_table(index, layer.get_full_table(index))
    mine, reference = layer(ids, weights), bank(ids, weights)
    for name in reference:
        np.testing.assert_allclose(mine[name].numpy(), reference[name].numpy(), rtol=1e-6, atol=1e-7, err_msg=name)
    np.testing.assert_allclose(layer(ids, weights, stacked=True).numpy(), bank(ids, weights, stacked=True).numpy(),
                               rtol=1e-6, atol=1e-7)


def dense_gradient(layer, loss_of, name):
    variables = layer.shard_variables + layer.replicated_variables
    with tf.GradientTape() as tape:
        loss = loss_of(layer(*batch()))
    full = {}
    for variable, gradient in zip(variables, tape.gradient(loss, [v.value for v in variables])):
        if gradient is None:
            continue
        if isinstance(gradient, tf.IndexedSlices):
            gradient = tf.math.unsorted_segment_sum(gradient.values, gradient.indices, variable.shape[0])
        full[variable.path] = gradient.numpy()
    index = [t.name for t in layer.plan.tables].index(name)
    table_rows = layer.plan.tables[index].rows
    # One process: every table whole in a fused variable; find its rows by matching the full table.
    values = layer.get_full_table(index)
    for variable in variables:
        array = variable.numpy()
        for start in range(array.shape[0] - table_rows + 1):
            if array.shape[1] == values.shape[1] and np.array_equal(array[start:start + table_rows], values):
                return full.get(variable.path, np.zeros_like(array))[start:start + table_rows]
    raise AssertionError(f"table {name} not found")


def test_gradients_are_scaled_by_the_weights_and_sent_per_position(layer):
    # d/d rows of sum(history * position factor): the id at position i of sample s gets w_si * factor_i.
    factor = tf.constant([1.0, 10.0, 100.0])[None, :, None]
    gradient = dense_gradient(layer, lambda out: tf.reduce_sum(out["history"] * factor), "items")
    expected = np.zeros(30)
    expected[3] += 0.5 * 1 + 2.0 * 10
    expected[7] += 1.0 * 100
    expected[29] += 3.0 * 1
    np.testing.assert_allclose(gradient, np.repeat(expected[:, None], 4, axis=1), rtol=1e-6)
    # Weighted mean of tags: sample 0 sends 1/4 and 3/4; sample 1 (weights summing to zero) sends nothing.
    gradient = dense_gradient(layer, lambda out: tf.reduce_sum(out["tags"]), "tags")
    expected = np.zeros(12)
    expected[[0, 1]] = [0.25, 0.75]
    np.testing.assert_allclose(gradient, np.repeat(expected[:, None], 6, axis=1), rtol=1e-6, atol=1e-7)
    gradient = dense_gradient(layer, lambda out: tf.reduce_sum(out["user"]), "users")
    expected = np.zeros(9)
    expected[[8, 0, 4]] = [2.0, 0.5, -1.0]
    np.testing.assert_allclose(gradient, np.repeat(expected[:, None], 4, axis=1), rtol=1e-6)


def test_bad_weights_are_named(layer):
    ids, weights = batch()
    with pytest.raises(ValueError, match="'tags' is weighted: expected its weights"):
        layer(ids, {k: v for k, v in weights.items() if k != "tags"})
    with pytest.raises(ValueError, match=r"weights of weighted features only.*\['item'\]"):
        layer(ids, {**weights, "item": tf.ones([3])})
    short = tf.ragged.constant([[1.0], [0.0], []])
    with pytest.raises(tf.errors.InvalidArgumentError, match="'tags': the weights do not match the ids"):
        layer(ids, {**weights, "tags": short})


def test_config_round_trip_keeps_weights_and_sequences():
    layer = DistributedEmbedding(features(), seed=3)
    again = DistributedEmbedding.from_config(layer.get_config())
    assert [f.to_dict() for f in again.output_features] == [f.to_dict() for f in layer.output_features]
    assert again.output_features[0].sequence and again.output_features[0].weighted
    assert list(again.input_modes) == [f.name for f in features()]
    with pytest.raises(ValueError, match="combiner in"):
        FeatureConfig("x", ITEMS, combiner="max")


def test_unweighted_sequences_pool_through_the_kernel_like_the_bank():
    from tf_dlrm.ops.embedding_bag import bag_kernel

    unweighted = [f for f in features() if not f.weighted]
    layer = DistributedEmbedding(unweighted, seed=3, use_kernel=True)
    layer.build()
    if bag_kernel() is not None:  # no weighted feature: the kernel pools the positions
        assert any(layer._group_kernel)
    names = [t.name for t in layer.plan.tables]
    bank = EmbeddingBank([t.rows for t in layer.plan.tables], [t.dim for t in layer.plan.tables],
                         features=[f.to_dict() | {"table": f.table_name} for f in unweighted], table_names=names)
    bank.build()
    for index in range(len(names)):
        bank.set_full_table(index, layer.get_full_table(index))
    ids, _ = batch()
    ids = {f.name: ids[f.name] for f in unweighted}
    with tf.GradientTape(persistent=True) as tape:
        mine, reference = layer(ids)["clicks"], bank(ids)["clicks"]
        loss, reference_loss = tf.reduce_sum(mine * mine), tf.reduce_sum(reference * reference)
    np.testing.assert_allclose(mine.numpy(), reference.numpy(), rtol=1e-6)
    gradient = tape.gradient(loss, layer.shard_variables[0].value)
    expected = tape.gradient(reference_loss, bank.tables[names.index("items")])
    dense = tf.math.unsorted_segment_sum(gradient.values, gradient.indices, layer.shard_variables[0].shape[0]).numpy()
    expected = tf.math.unsorted_segment_sum(expected.values, expected.indices, 30).numpy()
    np.testing.assert_allclose(dense[:30], expected, rtol=1e-6)


def test_bad_ids_of_a_sequence_feature_are_named_by_the_feature(layer):
    ids, weights = batch()
    outside = tf.ragged.constant([[3, 30], [], [29]], dtype=tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"feature 'clicks': an id is outside \[0, 30\)"):
        layer({**ids, "clicks": outside}, weights)
    longer = tf.ragged.constant([[1, 2, 3, 4], [], []], dtype=tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match="'clicks': a sample has more ids than its hotness 3"):
        layer({**ids, "clicks": longer}, weights)


def test_a_sequence_feature_beside_a_dynamic_table_stacks_as_its_positions():
    from tf_dlrm.embedding import DynamicStorage, Placement

    queries = TableConfig("queries", 1, 4, placement=Placement(dynamic=DynamicStorage(capacity=50)))
    layer = DistributedEmbedding([FeatureConfig("clicks", ITEMS, hotness=3, ragged=True, combiner=None),
                                  FeatureConfig("query", queries)], seed=3)
    layer.build()
    ids = {"clicks": tf.ragged.constant([[1, 2], [], [5, 6, 7]], dtype=tf.int64),
           "query": tf.constant([2**40, 7, 2**40], tf.int64)}
    out = layer(ids)
    stacked = layer(ids, stacked=True)
    assert out["clicks"].shape == (3, 3, 4) and out["query"].shape == (3, 4)
    assert stacked.shape == (3, 4, 4) and layer.compute_output_shape(None) == (None, 4, 4)
    np.testing.assert_array_equal(stacked[:, :3].numpy(), out["clicks"].numpy())
    np.testing.assert_array_equal(stacked[:, 3].numpy(), out["query"].numpy())


def test_the_bank_counts_a_sequence_as_its_positions_like_the_layer(layer):
    names = [t.name for t in layer.plan.tables]
    bank = EmbeddingBank([t.rows for t in layer.plan.tables], [t.dim for t in layer.plan.tables],
                         features=[f.to_dict() | {"table": f.table_name} for f in features()], table_names=names)
    assert bank.output_widths == layer.output_widths and bank.compute_output_shape(None) == layer.compute_output_shape(None)
