"""Row bands in one process: a band's share of a pooled lookup, and what a layer with row-sliced tables refuses.

Every row-band layout trains as one process does on 2, 3 and 4 Horovod ranks in tests/embedding/test_equivalence.py
(the ``rows_*`` and ``grid_*`` cases); here, without Horovod: the partial vectors that the bands of a table pool add
up to the whole table's pooled vector for every combiner, weighted or not (float32 sums of at most 4 terms in another
order: 1e-6 of vectors of size <= 4 * 0.05), and ids outside a band are not looked up there (no row, so no gradient).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from plan_layer import plan_layer
from tf_dlrm.embedding.pooling import band_entry, pooled_lookup
from tf_dlrm.sharding.plan import TableSpec
from tf_dlrm.sharding.planner import make_plan

ROWS, WIDTH = 100, 4
BANDS = ((0, 30), (30, 70), (70, 100))


def _table(values=None) -> keras.Variable:
    values = np.random.default_rng(0).uniform(-0.05, 0.05, (ROWS, WIDTH)).astype(np.float32) if values is None else values
    return keras.Variable(values, dtype="float32")  # the layer's tables are Keras variables (read through .value)


def _band_sum(table, ids, weights, combiner):
    total = 0.0
    for start, end in BANDS:
        kept, kept_weights = band_entry(ids, weights, combiner, start, end)
        assert bool(tf.reduce_all((kept.values >= 0) & (kept.values < end - start)))
        # The band's own rows, as its owner holds them (its fused variable starts at the band's first row).
        band = _table(table.numpy()[start:end])
        total += pooled_lookup(band, [(kept, 0, "sum", kept_weights)], tf.int32)
    return total


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True])
def test_the_bands_pooled_vectors_add_up_to_the_whole_tables(combiner, weighted):
    table = _table()
    ids = tf.ragged.constant([[1, 35, 99, 35], [], [80], [29, 30, 69, 70]], dtype=tf.int32)
    weights = tf.constant([0.5, 2.0, 1.0, -1.0, 3.0, 0.25, 1.0, 1.0, 4.0], tf.float32) if weighted else None
    whole = pooled_lookup(table, [(ids, 0, combiner, weights)], tf.int32)
    np.testing.assert_allclose(_band_sum(table, ids, weights, combiner).numpy(), whole.numpy(), rtol=0, atol=1e-6)
    one_hot = tf.constant([0, 29, 30, 99, 70], tf.int32)
    whole = pooled_lookup(table, [(one_hot, 0, combiner)], tf.int32)
    np.testing.assert_allclose(_band_sum(table, one_hot, None, combiner).numpy(), whole.numpy(), rtol=0, atol=0)


def test_a_band_looks_up_only_its_own_ids():
    kept, weights = band_entry(tf.constant([5, 31, 69, 70], tf.int64), None, "mean", 30, 70)
    assert kept.to_list() == [[], [1], [39], []] and weights is None


def test_row_bands_refuse_the_deduplicated_exchange_and_split_tables():
    plan = make_plan([TableSpec("t0", 3000, 4), TableSpec("t1", 300, 4)], 2, "table_wise", data_parallel_threshold=0,
                     row_slice_threshold=1000)
    assert plan.row_sliced == (0, 1)
    layer = plan_layer(plan)
    assert len(layer.band_permutations) == 1  # one further band to add on every rank
    with pytest.raises(ValueError, match=r"Row-sliced tables \['t0', 't1'\] cannot be combined with deduplicate_exchange "
                                         r"\(--deduplicate_exchange\): keep them whole or column-sliced"):
        plan_layer(plan, deduplicate_exchange=True)
    policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        with pytest.raises(ValueError, match=r"cannot be combined with split bfloat16 storage \(--split_embedding_tables\)"):
            plan_layer(plan, storage="split_bfloat16")
    finally:
        keras.mixed_precision.set_global_policy(policy)
