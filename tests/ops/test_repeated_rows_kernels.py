"""The kernels for gradients with repeated rows against the TensorFlow ops they replace, bit for bit: the
deduplication (tf_dlrm/ops/deduplicate.cc) against ``tf.unique`` + ``tf.math.unsorted_segment_sum``, and
sparse SGD on repeated rows (``TfDlrmSparseApplySgd`` with ``distinct_rows=False``) against TensorFlow's
sequential proximal SGD. The sparse optimizers' results must not depend on whether the library is loaded."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tf_dlrm import ops
from tf_dlrm.optimizers.sparse_optimizer import deduplicate
from tf_dlrm.optimizers.sparse_sgd import SparseSGD

pytestmark = pytest.mark.skipif(ops.kernels() is None, reason="the kernel library is not built here")


def plain(gradient):
    with ops.kernels_off():
        return tf.function(deduplicate)(gradient)


def with_kernel(gradient):
    return tf.function(deduplicate)(gradient)


SHAPES = [
    (0, 5, 3),  # an empty gradient
    (1, 5, 1),
    (3000, 40, 7),  # many repeats of few rows, a width under one chunk of columns
    (3000, 40, 37),  # a width of two chunks and a remainder
    (20000, 2**31 - 1, 16),  # ids far larger than their count: the hash index
    (50000, 300_000, 128),  # criteo-like: a skewed id distribution, wide rows, many threads' work
    (4000, 3000, 1),  # rows of one value: many rows to a cache line
]


def gradient_of(index_dtype, count, rows, width, rng):
    ids = rng.zipf(1.2, count) % rows  # skewed: a few rows take most entries
    # Values of very different magnitudes: any change in the order of the additions changes bits.
    values = rng.standard_normal((count, width)).astype(np.float32) * (10.0 ** rng.integers(-4, 4, (count, 1))).astype(np.float32)
    return ids, values, tf.IndexedSlices(tf.constant(values), tf.constant(ids, index_dtype))


@pytest.mark.parametrize("index_dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("count, rows, width", SHAPES)
def test_deduplication_has_the_bits_of_unique_and_segment_sum(index_dtype, count, rows, width):
    ids, values, gradient = gradient_of(index_dtype, count, rows, width, np.random.default_rng(count + width))
    fast, reference = with_kernel(gradient), plain(gradient)
    for name, got, expected in zip(("unique", "summed", "position"), fast, reference):
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        np.testing.assert_array_equal(got.numpy(), expected.numpy(), err_msg=name)
    # And the sums are right (not merely equal to TensorFlow's): float64 sums within float32 roundoff.
    unique, summed, position = (t.numpy() for t in fast)
    np.testing.assert_array_equal(unique[position], ids)
    exact = np.zeros((len(unique), width))
    np.add.at(exact, position, values.astype(np.float64))
    magnitude = np.zeros((len(unique), width))
    np.add.at(magnitude, position, np.abs(values.astype(np.float64)))
    assert np.all(np.abs(summed - exact) <= 1e-6 * magnitude + 1e-30)


def test_negative_rows_are_refused():
    gradient = tf.IndexedSlices(tf.ones([3, 2]), tf.constant([0, -4, 1]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="Expected non-negative rows. Received: -4 at 1"):
        with_kernel(gradient)


def test_other_dtypes_take_tensorflows_ops():
    gradient = tf.IndexedSlices(tf.constant([[1.0], [2.0], [4.0]], tf.bfloat16), tf.constant([2, 0, 2]))
    unique, summed, position = with_kernel(gradient)
    assert unique.numpy().tolist() == [2, 0] and position.numpy().tolist() == [0, 1, 0]
    assert summed.dtype == tf.bfloat16 and summed.numpy().astype(np.float32).ravel().tolist() == [5.0, 2.0]


@pytest.mark.parametrize("index_dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("count, rows, width", [
    # The criteo-like table's sequential reference is slow: it runs in `make test`, not the unit tier.
    pytest.param(*shape, marks=pytest.mark.slow) if shape[0] * shape[2] > 10**6 else shape
    for shape in SHAPES if shape[1] < 10**6])
def test_sgd_on_repeated_rows_has_the_bits_of_sequential_sgd(index_dtype, count, rows, width):
    rng = np.random.default_rng(count + width)
    _, _, gradient = gradient_of(index_dtype, count, rows, width, rng)
    table = rng.standard_normal((rows, width)).astype(np.float32)

    def train(variable):
        SparseSGD.apply_repeated(variable, gradient, 0.05)

    fast, reference = tf.Variable(table), tf.Variable(table)
    tf.function(train)(fast)
    with ops.kernels_off():
        tf.function(train)(reference)
    np.testing.assert_array_equal(fast.numpy(), reference.numpy())
    assert count == 0 or not np.array_equal(fast.numpy(), table)


def test_sgd_refuses_rows_outside_the_table():
    variable = tf.Variable(tf.zeros([4, 2]))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"row 4 at position 1 is outside \[0, 4\)"):
        SparseSGD.apply_repeated(variable, tf.IndexedSlices(tf.ones([2, 2]), tf.constant([1, 4])), 0.1)
