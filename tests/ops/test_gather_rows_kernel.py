"""``TfDlrmGatherRows`` (rows of a float32 table straight into bfloat16) and ``TfDlrmSparseApplySgd`` on
bfloat16 gradients, bit for bit against the ops they replace: ``tf.cast(tf.gather(...))`` forward, and the
cast of the gradient to float32 followed by the float32 update backward."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_dlrm import ops
from tf_dlrm.embedding.exchange import gather_rows
from tf_dlrm.ops.embedding_bag import apply_sgd_to_distinct_rows, gather_rows_as
from tf_dlrm.optimizers.sparse_sgd import SparseSGD

pytestmark = pytest.mark.skipif(ops.kernels() is None, reason="the kernel library is not built here")


def table(rows, width, seed=0):
    rng = np.random.default_rng(seed)
    # Magnitudes over many binades and values at bfloat16 ties (low 16 bits 0x8000): rounding shows.
    values = rng.standard_normal((rows, width)).astype(np.float32) * (10.0 ** rng.integers(-3, 3, (rows, 1))).astype(np.float32)
    ties = values.view(np.uint32)
    ties[::3, ::2] = (ties[::3, ::2] & 0xFFFF0000) | 0x8000
    return keras.Variable(values, dtype="float32", autocast=False)


@pytest.mark.parametrize("index_dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("shape", [(0,), (7,), (5000,), (300, 26)])
def test_rows_are_the_cast_of_the_gathered_rows(index_dtype, shape):
    variable = table(1000, 33)
    ids = tf.constant(np.random.default_rng(1).integers(0, 1000, shape), index_dtype)
    got = tf.function(lambda i: gather_rows_as(variable, i, tf.bfloat16))(ids)
    expected = tf.cast(tf.gather(variable.value, ids), tf.bfloat16)
    assert got.dtype == tf.bfloat16 and got.shape == expected.shape == (*shape, 33)
    np.testing.assert_array_equal(got.numpy().view(np.uint16), expected.numpy().view(np.uint16))


def test_float32_rows_are_the_gathered_rows():
    variable = table(50, 4)
    ids = tf.constant([3, 3, 49, 0])
    np.testing.assert_array_equal(gather_rows_as(variable, ids, tf.float32).numpy(), variable.numpy()[[3, 3, 49, 0]])


def test_gradient_is_bfloat16_slices_of_the_rows_read():
    variable = table(20, 3)
    ids = tf.constant([[4, 7], [4, 19]])
    upstream = tf.constant(np.arange(12, dtype=np.float32).reshape(2, 2, 3), tf.bfloat16)
    with tf.GradientTape() as tape:  # watches the trainable variable: the op tells the tape it was read
        rows = gather_rows(variable, ids, tf.bfloat16)
        loss = tf.reduce_sum(tf.cast(rows * upstream, tf.float32))
    gradient = tape.gradient(loss, variable.value)
    assert isinstance(gradient, tf.IndexedSlices) and gradient.values.dtype == tf.bfloat16
    assert gradient.indices.numpy().tolist() == [4, 7, 4, 19]
    np.testing.assert_array_equal(gradient.values.numpy().astype(np.float32), np.arange(12, dtype=np.float32).reshape(4, 3))
    assert tf.convert_to_tensor(gradient.dense_shape).numpy().tolist() == [20, 3]


def test_without_the_kernels_the_same_values_come_from_gather_and_cast():
    variable = table(100, 8)
    ids = tf.constant([1, 99, 5, 1])
    with ops.kernels_off():
        plain = tf.function(lambda i: gather_rows(variable, i, tf.bfloat16))(ids)
    fast = tf.function(lambda i: gather_rows(variable, i, tf.bfloat16))(ids)
    np.testing.assert_array_equal(fast.numpy().view(np.uint16), plain.numpy().view(np.uint16))


def test_ids_outside_the_table_are_refused():
    variable = table(10, 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"indices\[1\] = 10 is not in \[0, 10\)"):
        gather_rows_as(variable, tf.constant([0, 10]), tf.bfloat16)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"indices\[0\] = -1 is not in \[0, 10\)"):
        gather_rows_as(variable, tf.constant([-1], tf.int64), tf.bfloat16)


@pytest.mark.parametrize("distinct", [True, False])
def test_sgd_on_bfloat16_gradients_has_the_bits_of_the_float32_update(distinct):
    rng = np.random.default_rng(2)
    rows = rng.permutation(400)[:150] if distinct else rng.zipf(1.3, 3000) % 400
    values = tf.cast(rng.standard_normal((len(rows), 16)).astype(np.float32), tf.bfloat16)
    gradient = tf.IndexedSlices(values, tf.constant(rows, tf.int32))
    widened = tf.IndexedSlices(tf.cast(values, tf.float32), gradient.indices)
    fast, reference = table(400, 16, seed=3), table(400, 16, seed=3)
    apply = apply_sgd_to_distinct_rows if distinct else SparseSGD.apply_repeated
    apply(fast, gradient, 0.05)
    apply(reference, widened, 0.05)
    np.testing.assert_array_equal(fast.numpy(), reference.numpy())
    assert not np.array_equal(fast.numpy(), table(400, 16, seed=3).numpy())
