"""tf_dlrm's embedding-bag kernel (tf_dlrm/ops/embedding_bag.cc) against float64 numpy: pooled
lookups of several entries of one fused variable with every combiner, their gradient over distinct
rows (duplicates in a sample, across the batch and across entries sharing a table summed), the
SGD update of distinct rows, bad input, and the same values as the plain TensorFlow path."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from arithmetic import float32_sum_bound
from tf_dlrm import ops
from tf_dlrm.ops.embedding_bag import apply_sgd_to_distinct_rows, bag_kernel, bag_lookup, multi_table_bag_lookup
from tf_dlrm.embedding.pooling import pooled_lookup


def library():
    loaded = bag_kernel()
    assert loaded is not None, f"{ops.LIBRARY} is not built: scripts/install.sh runs python -m tf_dlrm.ops.build"
    return loaded


def scale(combiner: str, count: int) -> float:
    safe = max(count, 1)
    return {"sum": 1.0, "mean": 1.0 / safe, "sqrtn": 1.0 / np.sqrt(safe)}[combiner]


def reference(table, entries, upstream):
    """Forward [n, E * w] and the dense gradient [rows, w] in float64 from the definition; entries
    are (list of id lists per sample, offset, combiner)."""
    table = table.astype(np.float64)
    width = table.shape[1]
    batch = len(entries[0][0])
    forward = np.zeros((batch, len(entries) * width))
    gradient = np.zeros_like(table)
    for e, (samples, offset, combiner) in enumerate(entries):
        for s, ids in enumerate(samples):
            factor = scale(combiner, len(ids))
            columns = slice(e * width, (e + 1) * width)
            for i in ids:
                forward[s, columns] += factor * table[offset + i]
                gradient[offset + i] += factor * upstream[s, columns].astype(np.float64)
    return forward, gradient


def as_input(samples, one_hot: bool, index_dtype):
    if one_hot:
        return tf.constant([ids[0] for ids in samples], index_dtype)
    return tf.ragged.constant(samples, dtype=index_dtype)


def random_entries(rng, batch, slices, slice_rows):
    """Entries over ``slices`` table slices of ``slice_rows`` rows; slice 0 is read by two entries;
    small id ranges make duplicates within a sample and across the batch certain."""
    specs = [(0, "sum", "ragged"), (0, "mean", "ragged"), (1, "sqrtn", "fixed"), (2, "sum", "one_hot"),
             (1, "mean", "fixed"), (2, "sqrtn", "ragged")]
    entries = []
    for slice_index, combiner, kind in specs[: max(slices + 2, 3)]:
        slice_index %= slices
        if kind == "one_hot":
            samples = [[int(rng.integers(0, slice_rows))] for _ in range(batch)]
        elif kind == "fixed":
            samples = [list(rng.integers(0, 6, 4)) for _ in range(batch)]
        else:  # ragged, with empty rows
            samples = [list(rng.integers(0, 5, rng.integers(0, 6))) for _ in range(batch)]
            samples[0] = []
        entries.append((samples, slice_index * slice_rows, combiner, kind == "one_hot"))
    return entries


@pytest.mark.parametrize("index_dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("batch,slices,width", [(1, 1, 1), (7, 2, 5), (33, 3, 16), (64, 3, 33)])
def test_forward_and_gradient_match_float64_reference(batch, slices, width, index_dtype):
    rng = np.random.default_rng(batch * 10 + width)
    slice_rows = 9
    table = rng.normal(size=(slices * slice_rows, width)).astype(np.float32)
    entries = random_entries(rng, batch, slices, slice_rows)
    upstream = rng.normal(size=(batch, len(entries) * width)).astype(np.float32)
    variable = tf.Variable(table)
    inputs = [(as_input(samples, one_hot, index_dtype), offset, combiner) for samples, offset, combiner, one_hot in entries]
    with tf.GradientTape() as tape:
        pooled = bag_lookup(variable, inputs, index_dtype)
    gradient = tape.gradient(pooled, variable, output_gradients=upstream)
    plain = [(s, o, c) for s, o, c, _ in entries]
    expected, expected_gradient = reference(table, plain, upstream)
    absolute, absolute_gradient = reference(np.abs(table), plain, np.abs(upstream))
    # A float32 sum of at most 5 rows, scaled once (the scale itself rounded once): 7 roundings.
    assert np.all(np.abs(pooled.numpy() - expected) <= float32_sum_bound(absolute, 7))
    assert isinstance(gradient, tf.IndexedSlices)
    rows = gradient.indices.numpy()
    assert rows.dtype == index_dtype.as_numpy_dtype
    # One entry per distinct row, duplicates (in a sample, across samples, across the two entries
    # of slice 0) summed: exactly the rows the entries read.
    assert len(set(rows.tolist())) == len(rows)
    touched = sorted({o + i for s, o, _, _ in entries for ids in s for i in ids})
    assert sorted(rows.tolist()) == touched
    dense = np.zeros_like(expected_gradient)
    dense[rows] = gradient.values.numpy()
    # A row's gradient sums at most all occurrences, each scaled (two roundings per term).
    occurrences = sum(len(ids) for s, _, _, _ in entries for ids in s)
    assert np.all(np.abs(dense - expected_gradient) <= float32_sum_bound(absolute_gradient, 2 * occurrences + 2))
    assert tuple(gradient.dense_shape.numpy()) == table.shape


def test_empty_rows_pool_to_zero_with_every_combiner():
    variable = tf.Variable(np.ones((4, 3), np.float32))
    ids = tf.ragged.constant([[], [1, 1], []], dtype=tf.int32)
    pooled = bag_lookup(variable, [(ids, 0, c) for c in ("sum", "mean", "sqrtn")], tf.int32).numpy()
    np.testing.assert_array_equal(pooled[[0, 2]], 0.0)
    np.testing.assert_allclose(pooled[1], [2.0] * 3 + [1.0] * 3 + [np.sqrt(2.0)] * 3, rtol=1e-6)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_same_values_and_dense_gradient_as_the_tensorflow_path(combiner):
    rng = np.random.default_rng(3)
    # A Keras variable, as the layer's (pooled_lookup gathers from the tf.Variable under it).
    variable = keras.Variable(rng.normal(size=(50, 8)).astype(np.float32))
    ragged = tf.RaggedTensor.from_row_lengths(rng.integers(0, 20, 40).astype(np.int32), [5, 0, 7, 3, 9, 2, 6, 8])
    fixed = tf.RaggedTensor.from_uniform_row_length(rng.integers(0, 20, 24).astype(np.int32), 3)
    one_hot = tf.constant(rng.integers(0, 10, 8).astype(np.int32))
    entries = [(ragged, 0, combiner), (fixed, 20, combiner), (one_hot, 40, "sum"), (fixed, 0, combiner)]
    results = []
    for kernel in (True, False):
        with tf.GradientTape() as tape:
            tape.watch(variable.value)
            pooled = pooled_lookup(variable, entries, tf.int32, kernel=kernel)
            loss = tf.reduce_sum(tf.sin(pooled))
        results.append((pooled.numpy(), tf.convert_to_tensor(tape.gradient(loss, variable.value)).numpy()))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-5, atol=1e-6)


def test_a_tape_watching_trainable_variables_records_the_lookup():
    variable = tf.Variable(np.ones((6, 2), np.float32))
    with tf.GradientTape() as tape:  # no watch(): the lookup tells the tape it read the variable
        pooled = bag_lookup(variable, [(tf.ragged.constant([[1, 2]], dtype=tf.int32), 0, "sum")], tf.int32)
    assert tape.gradient(pooled, variable) is not None


def test_in_a_tf_function_with_int64_row_splits_and_unknown_batch():
    variable = tf.Variable(np.arange(12, dtype=np.float32).reshape(6, 2))

    @tf.function(input_signature=[tf.RaggedTensorSpec([None, None], tf.int64, row_splits_dtype=tf.int64)])
    def pooled(ids):
        return bag_lookup(variable, [(ids, 2, "mean")], tf.int32)

    assert pooled.get_concrete_function().structured_outputs.shape.as_list() == [None, 2]
    np.testing.assert_allclose(pooled(tf.ragged.constant([[0, 3], [1]], dtype=tf.int64)).numpy(), [[7.0, 8.0], [6.0, 7.0]])


def test_ids_outside_the_slice_are_refused_by_name():
    variable = tf.Variable(np.zeros((10, 2), np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"entry 1: an id is outside \[0, 4\) \(id 4 at position 1"):
        bag_lookup(variable, [(tf.constant([0, 1], tf.int32), 0, "sum"), (tf.constant([0, 4], tf.int32), 6, "sum")], tf.int32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"an id is outside \[0, 10\) \(id -1 at position 0"):
        bag_lookup(variable, [(tf.ragged.constant([[-1], []], dtype=tf.int32), 0, "sum")], tf.int32)
    # With checks: the table's own rows (not the variable's), the hotness, the feature's name.
    ragged = tf.ragged.constant([[1, 2, 3], [5]], dtype=tf.int32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"feature 'history': an id is outside \[0, 5\) \(id 5 at position 3"):
        bag_lookup(variable, [(ragged, 0, "mean")], tf.int32, checks=[("history", 5, 3)])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"feature 'history': a sample has more ids than its hotness 2 \(sample 0 has 3\)"):
        bag_lookup(variable, [(ragged, 0, "mean")], tf.int32, checks=[("history", 6, 2)])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"feature 'wide': rows \[8, 14\) are outside the variable's 10 rows"):
        bag_lookup(variable, [(ragged, 8, "sum")], tf.int32, checks=[("wide", 6, 0)])
    np.testing.assert_array_equal(bag_lookup(variable, [(ragged, 0, "sum")], tf.int32, checks=[("history", 6, 3)]).numpy(), 0.0)


def raw_bag(variable, values, row_splits, offsets, combiners, width):
    count = len(values)
    return library().tf_dlrm_embedding_bag(
        tables=[variable.handle], values=values, row_splits=row_splits, offsets=offsets, combiners=combiners,
        table_of=[0] * count, columns=[e * width for e in range(count)], widths=[width], output_width=count * width)


def test_bad_row_splits_and_combiners_are_refused():
    variable = tf.Variable(np.zeros((10, 2), np.float32))
    values = tf.constant([1, 2, 3], tf.int32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="end at the number of values"):
        raw_bag(variable, values=[values], row_splits=[tf.constant([0, 2], tf.int64)],
                                        offsets=[0], combiners=["sum"], width=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="decrease at sample 1"):
        raw_bag(variable, values=[values], row_splits=[tf.constant([0, 3, 2, 3], tf.int64)],
                                        offsets=[0], combiners=["sum"], width=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="entry 1 has 1 samples; entry 0 has 2"):
        raw_bag(variable, values=[values, values],
                                        row_splits=[tf.constant([0, 1, 3], tf.int64), tf.constant([0, 3], tf.int64)],
                                        offsets=[0, 0], combiners=["sum", "sum"], width=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="combiners in"):
        raw_bag(variable, values=[values], row_splits=[tf.constant([0, 3], tf.int64)],
                                        offsets=[0], combiners=["max"], width=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="table 0 has width 2; the op was built for 3"):
        raw_bag(variable, values=[values], row_splits=[tf.constant([0, 3], tf.int64)],
                                        offsets=[0], combiners=["sum"], width=3)


def test_sgd_on_distinct_rows_matches_numpy_and_leaves_earlier_reads_alone():
    rng = np.random.default_rng(5)
    table = rng.normal(size=(1000, 24)).astype(np.float32)
    variable = tf.Variable(table)
    earlier = variable.read_value()  # shares the variable's buffer until a sparse update copies it
    rows = rng.permutation(1000)[:300].astype(np.int32)
    values = rng.normal(size=(300, 24)).astype(np.float32)
    apply_sgd_to_distinct_rows(variable, tf.IndexedSlices(tf.constant(values), tf.constant(rows)), 0.5)
    expected = table.copy()
    expected[rows] -= np.float32(0.5) * values
    np.testing.assert_array_equal(variable.numpy(), expected)
    np.testing.assert_array_equal(earlier.numpy(), table)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"row 1000 at position 0 is outside \[0, 1000\)"):
        apply_sgd_to_distinct_rows(variable, tf.IndexedSlices(tf.zeros([1, 24]), tf.constant([1000], tf.int32)), 0.5)


def test_several_variables_in_one_op_write_any_column_order():
    """Two variables of widths 3 and 2, entries placed out of variable order: the same values and
    per-variable gradients as one op per variable followed by a column permutation."""
    rng = np.random.default_rng(11)
    narrow, wide = tf.Variable(rng.normal(size=(12, 2)).astype(np.float32)), tf.Variable(rng.normal(size=(9, 3)).astype(np.float32))
    a = tf.ragged.constant([[1, 1, 4], [], [8, 0]], dtype=tf.int32)
    b = tf.constant([[2, 5], [5, 5], [0, 1]], tf.int32)
    b = tf.RaggedTensor.from_tensor(b)
    c = tf.constant([3, 3, 7], tf.int32)
    # Output columns: c (narrow, 0:2), a (wide, 2:5), b (narrow, 5:7).
    entries = [(a, 0, "mean", 1, 2), (b, 6, "sqrtn", 0, 5), (c, 0, "sum", 0, 0)]
    upstream = rng.normal(size=(3, 7)).astype(np.float32)
    with tf.GradientTape(persistent=True) as tape:
        joint = multi_table_bag_lookup([narrow, wide], entries, tf.int32)
        apart = tf.concat([bag_lookup(narrow, [(c, 0, "sum")], tf.int32), bag_lookup(wide, [(a, 0, "mean")], tf.int32),
                           bag_lookup(narrow, [(b, 6, "sqrtn")], tf.int32)], axis=1)
    np.testing.assert_allclose(joint.numpy(), apart.numpy(), rtol=1e-6)
    for variable in (narrow, wide):
        ours = tape.gradient(joint, variable, output_gradients=upstream)
        theirs = tape.gradient(apart, variable, output_gradients=upstream)
        assert len(set(ours.indices.numpy().tolist())) == len(ours.indices.numpy())
        np.testing.assert_allclose(tf.convert_to_tensor(ours).numpy(), tf.convert_to_tensor(theirs).numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(tf.errors.InvalidArgumentError, match="must tile"):
        multi_table_bag_lookup([narrow, wide], [(a, 0, "mean", 1, 1), (c, 0, "sum", 0, 0)], tf.int32)


def test_lazy_adam_kernel_matches_the_tensorflow_ops(monkeypatch):
    """Three steps of SparseLazyAdam.apply on distinct rows: the kernel against the gather/scatter ops."""
    from tf_dlrm.ops import embedding_bag
    from tf_dlrm.optimizers.lazy_adam import SparseLazyAdam

    rng = np.random.default_rng(9)
    table = rng.normal(size=(500, 12)).astype(np.float32)
    results = []
    for kernel in (True, False):
        with monkeypatch.context() as patch:
            if not kernel:
                patch.setattr(embedding_bag, "bag_kernel", lambda: None)
            optimizer = SparseLazyAdam()
            variable = tf.Variable(table)
            earlier = variable.read_value()
            slots = optimizer.create_slots(variable)
            steps = np.random.default_rng(1)
            for step in range(1, 4):
                rows = steps.permutation(500)[:120].astype(np.int32)
                gradient = steps.normal(size=(120, 12)).astype(np.float32)
                optimizer.apply(variable, slots, tf.constant(rows), tf.constant(gradient), 0.01, step)
            results.append([variable.numpy(), slots["m"].numpy(), slots["v"].numpy()])
            np.testing.assert_array_equal(earlier.numpy(), table)
    for ours, theirs in zip(*results):
        # The same formula rounded in another order: a few float32 roundoffs (u = 6e-8) of the terms
        # summed, which are up to about 4 (|g| of normal draws, |w|): absolute 1e-6 where the sums
        # cancel (a moment near 0), relative 1e-5 elsewhere.
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    assert not np.array_equal(results[0][0], table)
