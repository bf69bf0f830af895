"""Bias gradients summed in float32 under mixed bfloat16 (TensorFlow's ``BiasAddGrad`` sums bfloat16 in
bfloat16 on the CPU), in the MLP and the cross network; and the MLP's own dense step gives the same values
and gradients as Keras's ``Dense``."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_dlrm.models.layers.bias import bias_gradient
from tf_dlrm.models.layers.cross_network import CrossNetwork
from tf_dlrm.models.layers.mlp import MLP


def gradients(mlp, inputs, upstream, through_keras: bool):
    """``d sum(mlp(inputs) * upstream)`` for the inputs and every variable, through the MLP's own dense
    step or through each Keras ``Dense`` called as a layer (activations as the MLP sets them)."""
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        if through_keras:
            outputs = inputs
            for layer in mlp.dense_layers:
                outputs = layer(outputs)
        else:
            outputs = mlp(inputs)
        loss = tf.reduce_sum(tf.cast(outputs, tf.float32) * upstream)
    return outputs, tape.gradient(loss, [inputs, *mlp.trainable_variables])


def assert_same_as_keras(mlp, batch: int, width: int, seed: int, atol: float):
    """The MLP's outputs and gradients (inputs and every variable) against each Keras ``Dense`` called in turn."""
    rng = np.random.default_rng(seed)
    inputs = tf.constant(rng.normal(size=(batch, width)).astype(np.float32))
    upstream = tf.constant(rng.normal(size=(batch, mlp.units[-1])).astype(np.float32))
    ours, our_gradients = gradients(mlp, inputs, upstream, through_keras=False)
    keras_outputs, keras_gradients = gradients(mlp, inputs, upstream, through_keras=True)
    # Same products, summed in another order at most: float32 rounding of sums of up to ~64 terms of unit size.
    np.testing.assert_allclose(ours.numpy(), keras_outputs.numpy(), rtol=1e-5, atol=atol)
    assert len(our_gradients) == 1 + 2 * len(mlp.units)
    for mine, theirs in zip(our_gradients, keras_gradients):
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-4, atol=10 * atol)
    return ours


@pytest.mark.parametrize("final_activation", ["relu", None])
def test_values_and_gradients_equal_keras_dense_in_float32(final_activation):
    mlp = MLP((16, 8, 4), final_activation=final_activation, seed=3)
    mlp.build((None, 5))
    assert_same_as_keras(mlp, batch=64, width=5, seed=0, atol=1e-5)


def test_mixed_bfloat16_bias_gradient_is_summed_in_float32():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        mlp = MLP((32,), final_activation=None, seed=1)
        mlp.build((None, 4))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    batch = 16384
    rng = np.random.default_rng(1)
    inputs = tf.constant(rng.normal(size=(batch, 4)).astype(np.float32))
    # Upstream values exact in bfloat16, so the true bias gradient is their float64 column sums.
    upstream = tf.cast(tf.cast(rng.normal(size=(batch, 32)).astype(np.float32), tf.bfloat16), tf.float32)
    _, (_, _, got) = gradients(mlp, inputs, upstream, through_keras=False)
    assert within_one_bfloat16_rounding(got.numpy().astype(np.float64), upstream.numpy().astype(np.float64).sum(axis=0))


def test_other_final_activations_are_applied_after():
    mlp = MLP((6, 3), final_activation="sigmoid", seed=5)
    mlp.build((None, 2))
    outputs = assert_same_as_keras(mlp, batch=16, width=2, seed=3, atol=1e-6).numpy()
    assert np.all((outputs > 0) & (outputs < 1))


def within_one_bfloat16_rounding(got, exact):
    # float32 sums of 16,384 unit terms, rounded once to bfloat16 (8 bits): within half an ulp, 2^-8 relative,
    # plus the float32 sum's own error. A sum kept in bfloat16 drifts by tens here (|exact| in the hundreds).
    return np.all(np.abs(got - exact) <= np.abs(exact) * 2.0 ** -8 + 1e-2)


def test_bias_gradient_of_bfloat16_rows():
    values = tf.cast(tf.random.stateless_normal([16384, 24], seed=[4, 0]), tf.bfloat16)
    got = bias_gradient(values)
    assert got.dtype == tf.bfloat16 and got.shape == (24,)
    exact = values.numpy().astype(np.float64).sum(axis=0)
    assert within_one_bfloat16_rounding(got.numpy().astype(np.float64), exact)
    assert not within_one_bfloat16_rounding(tf.raw_ops.BiasAddGrad(out_backprop=values).numpy().astype(np.float64), exact)


def test_mixed_bfloat16_cross_network_bias_gradient_is_summed_in_float32():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        network = CrossNetwork(1, seed=2)
        network.build((None, 16))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    batch = 16384
    x0 = tf.cast(tf.random.stateless_normal([batch, 16], seed=[5, 0]), tf.bfloat16)
    upstream = tf.cast(tf.random.stateless_normal([batch, 16], seed=[6, 0]), tf.bfloat16)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.cast(network(x0) * upstream, tf.float32))
    bias = network.cross_layers[0].bias
    got = tape.gradient(loss, bias.value).numpy().astype(np.float64)
    # x1 = x0 * (x0 W + b) + x0: d/db = the column sums of upstream * x0 (a bfloat16 product, as the step computes it).
    exact = tf.cast(upstream * x0, tf.float64).numpy().sum(axis=0)
    assert within_one_bfloat16_rounding(got, exact)
