"""One process: the dynamic table's routing, insertion, admission, eviction order and bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tf_dlrm.parallel.env import DistributedEnv
from tf_dlrm.checkpoint import dynamic_tables as checkpoint
from tf_dlrm.embedding.dynamic import hashing
from tf_dlrm.sharding import dynamic_routing as routing
from tf_dlrm.embedding.dynamic.layer import DynamicEmbedding
from tf_dlrm.embedding.dynamic.shard_state import ShardState
from tf_dlrm.embedding.table_config import DynamicStorage, Placement, TableConfig


def dynamic_layer(name: str, capacity: int, width: int, **options) -> DynamicEmbedding:
    """The inner layer of one dynamic table, new rows uniform in 1/sqrt(capacity)."""
    table = TableConfig(name, capacity, width, initializer="uniform_sqrt_rows",
                        placement=Placement(dynamic=DynamicStorage(capacity)))
    return DynamicEmbedding([table], **options)


def test_numpy_and_tensorflow_owners_agree_over_the_whole_key_range():
    keys = np.concatenate([np.array([0, 1, -1, 2**63 - 1, -2**63], np.int64),
                           np.random.default_rng(0).integers(-2**63, 2**63 - 1, 2000, dtype=np.int64)])
    for shards in (1, 2, 3, 4, 7):
        expected = routing.owner_shard(keys, shards)
        np.testing.assert_array_equal(hashing.owner_shard(tf.constant(keys), shards).numpy(), expected)
        assert set(expected) == set(range(shards))
    # SplitMix64 of 0 (a published value: the first output of SplitMix64 seeded with 0).
    assert int(routing.mix64(np.array([0], np.int64))[0]) == 0xE220A8397B1DCDAF


def test_initial_rows_depend_on_key_seed_and_table_only():
    keys = tf.constant([5, -7, 2**62], tf.int64)
    first = hashing.initial_rows(keys, seed=1, table=0, width=6, bound=0.5).numpy()
    again = hashing.initial_rows(tf.reverse(keys, [0]), seed=1, table=0, width=6, bound=0.5).numpy()[::-1]
    np.testing.assert_array_equal(first, again)
    assert np.all(np.abs(first) <= 0.5)
    assert not np.array_equal(first, hashing.initial_rows(keys, seed=2, table=0, width=6, bound=0.5).numpy())
    assert not np.array_equal(first, hashing.initial_rows(keys, seed=1, table=1, width=6, bound=0.5).numpy())


@pytest.mark.parametrize("field, value", [("capacity", 0), ("capacity", -3), ("min_count", 0), ("capacity", 2.5)])
def test_bad_dynamic_storage_is_refused_by_name(field, value):
    arguments = {"capacity": 10, field: value}
    with pytest.raises(ValueError, match=f"Expected {field} to be a positive integer for a dynamic table. "
                                         f"Received: {field}={value}"):
        DynamicStorage(**arguments)


def test_bad_policy_and_scope_are_refused():
    with pytest.raises(ValueError, match=r"eviction in \['none', 'lru', 'lfu'\]. Received: eviction='fifo'"):
        DynamicStorage(10, eviction="fifo")
    with pytest.raises(ValueError, match=r"capacity_scope in \['per_rank', 'total'\]"):
        DynamicStorage(10, capacity_scope="global")


def test_the_inner_layer_takes_dynamic_tables_only_and_their_keys_by_table_name():
    with pytest.raises(ValueError, match="Expected dynamic tables .*Received: table 'items'"):
        DynamicEmbedding([TableConfig("items", 10, 4)])
    layer = dynamic_layer("items", 8, 2)
    with pytest.raises(ValueError, match=r"Expected the keys of every dynamic table \['items'\] by table name. "
                                         r"Received: \['users'\]"):
        layer({"users": tf.constant([1], tf.int64)}, training=True)
    assert DynamicEmbedding.from_config(layer.get_config()).table_configs == layer.table_configs


@pytest.mark.parametrize("dtype", [tf.float32, tf.uint64, tf.string])
def test_key_dtype_other_than_signed_integers_is_refused(dtype):
    layer = dynamic_layer("items", 8, 2)
    keys = tf.constant(["a", "b"]) if dtype == tf.string else tf.constant([1, 2], dtype)
    with pytest.raises(ValueError, match="int64 \\(or int32\\) keys for dynamic feature 'items'"):
        layer({"items": keys}, training=True)


def test_routing_check_refuses_unsigned_dtype():
    with pytest.raises(ValueError, match="dynamic feature 'user'. Received: dtype=uint64"):
        routing.check_key_dtype(np.uint64, "user")


def _resolve(state, keys, step):
    keys = tf.constant(sorted(set(keys)), tf.int64)
    counts = tf.ones_like(keys)
    rows, _, _ = state.resolve(keys, counts, tf.constant(step, tf.int64))
    return dict(zip(keys.numpy().tolist(), rows.numpy().tolist()))


def _live(state):
    exported = state.export()
    return sorted(exported["keys"].tolist())


def test_lru_evicts_the_least_recently_used_ties_by_key():
    state = ShardState(3, "lru", 1, "lru_test")
    _resolve(state, [10, 20, 30], 1)
    _resolve(state, [20], 2)
    rows = _resolve(state, [20, 40], 3)  # 10 and 30 unused since step 1: the smaller key (10) goes
    assert _live(state) == [20, 30, 40] and rows[40] >= 0
    assert int(state.evictions.numpy()) == 1
    _resolve(state, [50, 60], 4)  # 20 (step 3) vs 30 (step 1) vs 40 (step 3): 30, then 20 (key order)
    assert _live(state) == [40, 50, 60]
    assert int(state.evictions.numpy()) == 3


def test_lfu_evicts_the_least_used_and_never_a_row_of_the_current_step():
    state = ShardState(2, "lfu", 1, "lfu_test")
    _resolve(state, [1, 2], 1)
    _resolve(state, [1], 2)
    _resolve(state, [1], 3)
    rows = _resolve(state, [2, 3], 4)  # 2 is used now (protected), 1 is the only candidate
    assert _live(state) == [2, 3] and rows[3] >= 0 and rows[2] >= 0


def test_full_shard_without_policy_rejects_new_keys_and_keeps_old_rows():
    state = ShardState(2, "none", 1, "reject_test")
    first = _resolve(state, [5, 6], 1)
    rows = _resolve(state, [5, 7, 8], 2)
    assert rows[7] == -1 and rows[8] == -1 and rows[5] == first[5]
    assert int(state.rejections.numpy()) == 2 and _live(state) == [5, 6]


def test_rows_idle_longer_than_max_idle_steps_are_dropped_and_their_rows_reused():
    state = ShardState(3, "none", 1, "idle_test", max_idle_steps=2)
    first = _resolve(state, [1, 2, 3], 1)
    _resolve(state, [1], 2)
    assert _resolve(state, [1, 5], 3)[5] == -1  # 2 and 3 were last used 2 steps ago: kept, the shard is full
    assert _live(state) == [1, 2, 3] and int(state.rejections.numpy()) == 1
    rows = _resolve(state, [1, 4], 4)  # now 3 steps idle: dropped; 4 takes the lowest freed row (key 2's)
    assert _live(state) == [1, 4] and rows[4] == first[2] and int(state.evictions.numpy()) == 2
    assert int(state.lookup(tf.constant([3], tf.int64)).numpy()[0]) == -1  # evaluation reads zeros for it
    exported = state.export()
    assert sorted(zip(exported["keys"].tolist(), exported["last_used"].tolist())) == [(1, 4), (4, 4)]


def test_min_count_admits_a_key_on_its_kth_sighting():
    state = ShardState(4, "none", 3, "admission_test")
    assert _resolve(state, [9], 1)[9] == -1
    assert _resolve(state, [9], 2)[9] == -1
    assert _resolve(state, [9], 3)[9] >= 0
    assert _live(state) == [9]


def test_training_inserts_evaluation_reads_zeros_and_inserts_nothing():
    layer = dynamic_layer("items", 8, 3, seed=4)
    seen = tf.constant([2**60, -5, 2**60], tf.int64)
    trained = layer({"items": seen}, training=True).numpy()
    expected = hashing.initial_rows(tf.constant([2**60, -5, 2**60], tf.int64), 4, 0, 3, 1 / np.sqrt(8)).numpy()
    np.testing.assert_array_equal(trained[:, 0, :], expected)
    evaluated = layer({"items": tf.constant([-5, 123], tf.int64)}, training=False).numpy()
    np.testing.assert_array_equal(evaluated[0, 0], expected[1])
    np.testing.assert_array_equal(evaluated[1, 0], np.zeros(3))
    assert layer.counters()["items"]["rows"] == 2


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_multi_hot_keys_pool_the_rows_one_hot_lookups_give(combiner):
    from tf_dlrm.embedding import DistributedEmbedding, DynamicStorage, FeatureConfig, Placement, TableConfig

    table = TableConfig("items", 50, 3, placement=Placement(dynamic=DynamicStorage(50)))
    ragged = DistributedEmbedding([FeatureConfig("history", table, hotness=4, ragged=True, combiner=combiner)], seed=2)
    fixed = DistributedEmbedding([FeatureConfig("pair", table, hotness=2, combiner=combiner)], seed=2)
    one_hot = DistributedEmbedding([FeatureConfig("item", table)], seed=2)
    keys = tf.ragged.constant([[7, -3, 7], [], [2**62], [5, 6, 7, 8]], tf.int64)
    trained = ragged({"history": keys}, training=True)["history"].numpy()  # inserts every key
    rows = one_hot({"item": keys.values}, training=True)["item"].numpy()  # the same seed: the same new rows
    counts = keys.row_lengths().numpy()
    starts = np.concatenate([[0], np.cumsum(counts)])
    for sample, count in enumerate(counts):
        total = rows[starts[sample]:starts[sample + 1]].sum(axis=0)
        scale = {"sum": 1.0, "mean": max(count, 1), "sqrtn": max(np.sqrt(count), 1)}[combiner]
        np.testing.assert_allclose(trained[sample], total / scale, rtol=1e-6, atol=1e-7)
    assert ragged.dynamic_layer.counters()["items"]["rows"] == 6  # distinct keys
    # Fixed hotness, evaluation: a key without a row adds zeros and still counts for mean and sqrtn.
    pair = fixed({"pair": tf.constant([[5, 6], [5, 999]], tf.int64)}, training=True)["pair"].numpy()
    unseen = fixed({"pair": tf.constant([[5, 123456]], tf.int64)}, training=False)["pair"].numpy()
    scale = {"sum": 1.0, "mean": 2.0, "sqrtn": np.sqrt(2.0)}[combiner]
    np.testing.assert_allclose(unseen[0], rows[4] / scale, rtol=1e-6, atol=1e-7)  # rows[4]: key 5's row
    np.testing.assert_allclose(pair[0], (rows[4] + rows[5]) / scale, rtol=1e-6, atol=1e-7)


def test_fixed_table_checkpoint_into_a_dynamic_table_is_a_clear_error(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "tf_dlrm.checkpoint", "version": 1}))
    layer = dynamic_layer("items", 8, 3)
    layer.build()
    with pytest.raises(ValueError, match="holds fixed embedding tables .*a dynamic table restores only"):
        checkpoint.restore_rows(str(tmp_path), layer, None, DistributedEnv())
    with pytest.raises(ValueError, match="Expected a dynamic-table checkpoint"):
        checkpoint.restore_rows(str(tmp_path / "nothing"), layer, None, DistributedEnv())


def test_restore_into_smaller_capacity_is_a_clear_error(tmp_path):
    big = dynamic_layer("items", 8, 3)
    big({"items": tf.constant([1, 2, 3, 4], tf.int64)}, training=True)
    checkpoint.save_rows(str(tmp_path), big, None, DistributedEnv())
    small = dynamic_layer("items", 3, 3)
    small.build()
    with pytest.raises(ValueError, match="holds 4 keys of table 'items' for shard 0 of 1; its capacity is 3 rows"):
        checkpoint.restore_rows(str(tmp_path), small, None, DistributedEnv())
    other = dynamic_layer("users", 8, 3)
    other.build()
    with pytest.raises(ValueError, match="do not match the model's"):
        checkpoint.restore_rows(str(tmp_path), other, None, DistributedEnv())
    restored = dynamic_layer("items", 8, 3)
    restored.build()
    checkpoint.restore_rows(str(tmp_path), restored, None, DistributedEnv())
    keys = tf.constant([4, 1, 99], tf.int64)
    np.testing.assert_array_equal(restored({"items": keys}, training=False).numpy(),
                                  big({"items": keys}, training=False).numpy())


def test_saved_model_serves_raw_keys_like_the_trained_model(tmp_path):
    from tf_dlrm.embedding import DistributedEmbedding
    from tf_dlrm.embedding.serving import export_saved_model
    from tf_dlrm.embedding.table_config import DynamicStorage, FeatureConfig, Placement, TableConfig
    from tf_dlrm.models.dlrm import DLRM
    from tf_dlrm.optimizers.settings import LearningRateSchedule
    from tf_dlrm.optimizers.settings import OptimizerConfig
    from tf_dlrm.train.step import Trainer

    # Two dynamic tables only: the layer runs one DynamicEmbedding inside.
    features = [FeatureConfig("user", TableConfig("user", 16, 4, placement=Placement(
                    dynamic=DynamicStorage(capacity=16, eviction="lru")))),
                FeatureConfig("item", TableConfig("item", 16, 4, placement=Placement(dynamic=DynamicStorage(capacity=16))))]
    model = DLRM(DistributedEmbedding(features, seed=2, env=DistributedEnv(), name="embedding"), num_numerical=3,
                 bottom_mlp_dims=[8, 4], top_mlp_dims=[4, 1], seed=2)
    rng = np.random.default_rng(1)
    keys = rng.integers(-2**63, 2**63 - 1, (12, 2), dtype=np.int64)
    numerical = rng.random((12, 3), dtype=np.float32)

    def inputs(rows):
        return {"numerical": tf.constant(numerical), "user": tf.constant(rows[:, 0]), "item": tf.constant(rows[:, 1])}

    model(inputs(keys))
    trainer = Trainer(model, DistributedEnv(), OptimizerConfig(LearningRateSchedule(0.1), optimizer="sgd",
                                                               embedding_optimizer="adagrad"))
    label = rng.integers(0, 2, (12, 1)).astype(np.float32)
    for _ in range(3):
        trainer.train_step(inputs(keys), label)
    served_keys = np.concatenate([keys[:6], rng.integers(-2**63, 2**63 - 1, (6, 2), dtype=np.int64)])  # half unseen
    expected = tf.sigmoid(model(inputs(served_keys), training=False)).numpy().reshape(-1)
    export_saved_model(model, str(tmp_path / "served"), {"numerical": tf.TensorSpec([None, 3], tf.float32),
                                                         "user": tf.TensorSpec([None], tf.int64),
                                                         "item": tf.TensorSpec([None], tf.int64)})
    # Served by a process that imports TensorFlow only (no tf_dlrm kernel library, no Horovod).
    np.savez(tmp_path / "inputs.npz", numerical=numerical, user=served_keys[:, 0], item=served_keys[:, 1])
    script = ("import sys, numpy as np, tensorflow as tf\n"
              "d = np.load(sys.argv[1] + '/inputs.npz'); m = tf.saved_model.load(sys.argv[1] + '/served')\n"
              "p = m.signatures['serving_default'](**{k: tf.constant(d[k]) for k in ('numerical', 'user', 'item')})\n"
              "np.save(sys.argv[1] + '/probability.npy', p['probability'].numpy())\n")
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, capture_output=True, cwd=str(tmp_path))
    probability = np.load(tmp_path / "probability.npy")
    np.testing.assert_allclose(probability, expected, rtol=0, atol=1e-6)
    assert model.embedding.dynamic_layer.counters()["user"]["rows"] == 12  # serving inserted nothing
