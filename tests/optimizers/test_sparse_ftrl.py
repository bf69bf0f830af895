"""Sparse FTRL-Proximal against a numpy transcription of its formula, touched rows only."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tf_dlrm.optimizers.sparse_ftrl import SparseFtrl
from tf_dlrm.optimizers.sparse_optimizer import deduplicate


def numpy_ftrl(w, n, z, rows, g, lr, l1, l2):
    for row, grad in zip(rows, g):
        n_new = n[row] + grad * grad
        z[row] += grad - (np.sqrt(n_new) - np.sqrt(n[row])) / lr * w[row]
        n[row] = n_new
        quadratic = np.sqrt(n_new) / lr + 2 * l2
        w[row] = np.where(np.abs(z[row]) > l1, (np.sign(z[row]) * l1 - z[row]) / quadratic, 0.0)


@pytest.mark.parametrize("l1,l2", [(0.0, 0.0), (2.0, 0.1)])
def test_sparse_ftrl_equals_numpy_over_steps(l1, l2):
    rng = np.random.default_rng(0)
    initial = rng.normal(size=(10, 3)).astype(np.float32)
    variable = tf.Variable(initial)
    optimizer = SparseFtrl(initial_accumulator=0.1, l1=l1, l2=l2)
    slots = optimizer.create_slots(variable)
    w, n, z = initial.astype(np.float64), np.full((10, 3), 0.1), np.zeros((10, 3))
    for step in range(1, 5):
        ids = rng.integers(0, 6, 8)  # repeats, and rows 6..9 never touched
        values = rng.normal(size=(8, 3)).astype(np.float32)
        rows, summed, _ = deduplicate(tf.IndexedSlices(tf.constant(values), tf.constant(ids, tf.int32)))
        optimizer.apply(variable, slots, rows, summed, tf.constant(0.5), step)
        numpy_ftrl(w, n, z, rows.numpy(), summed.numpy().astype(np.float64), 0.5, l1, l2)
        np.testing.assert_allclose(variable.numpy(), w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(slots["accumulator"].numpy(), n, rtol=1e-6)
        np.testing.assert_allclose(slots["linear"].numpy(), z, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(variable.numpy()[6:], initial[6:])
    if l1:
        assert (variable.numpy()[:6] == 0).any(), "l1 should zero some weights"


def test_sparse_ftrl_arguments_are_checked():
    with pytest.raises(ValueError, match="Received: initial_accumulator=0"):
        SparseFtrl(initial_accumulator=0)
    with pytest.raises(ValueError, match="Received: l1=-1"):
        SparseFtrl(l1=-1)
