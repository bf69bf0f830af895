"""DCNv2 cross layers, the FM terms and the crossed ids of Wide & Deep against numpy on fixed batches."""

from __future__ import annotations

import numpy as np
import pytest

from tf_dlrm.spec.crossed_features import CrossedFeature, crossed_bucket, parse_crossed_features
from tf_dlrm.models.layers.cross_layer import CrossLayer
from tf_dlrm.models.layers.cross_network import CrossNetwork
from tf_dlrm.models.layers.crossed_ids import crossed_ids
from tf_dlrm.models.layers.factorization_machine import FactorizationMachine, LinearTerm

TOLERANCE = 1e-6


def _batch(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _numpy_cross(x0, x, weights, low_rank):
    matrix = weights[0] @ weights[1] if low_rank else weights[0]
    bias = weights[-1]
    return x0 * (x @ matrix + bias) + x


@pytest.mark.parametrize("low_rank", [0, 3])
def test_cross_layer_equals_numpy(low_rank):
    x0, x = _batch((5, 8), 1), _batch((5, 8), 2)
    layer = CrossLayer(low_rank=low_rank, seed=4)
    layer.build(((None, 8), (None, 8)))
    # A non-zero bias, so the test sees it.
    layer.bias.assign(_batch((8,), 3))
    weights = [w.numpy().astype(np.float64) for w in layer.weights]
    assert len(weights) == (3 if low_rank else 2)
    expected = _numpy_cross(x0.astype(np.float64), x.astype(np.float64), weights, low_rank)
    np.testing.assert_allclose(layer((x0, x)).numpy(), expected, rtol=0, atol=TOLERANCE * np.abs(expected).max())


def test_cross_layer_by_hand():
    layer = CrossLayer()
    layer.build(((None, 2), (None, 2)))
    layer.kernel.assign(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
    layer.bias.assign(np.array([0.5, -1.0], np.float32))
    x0 = np.array([[1.0, 2.0]], np.float32)
    # x W = (1+6, 2+8) = (7, 10); + b = (7.5, 9); * x0 = (7.5, 18); + x = (8.5, 20)
    np.testing.assert_allclose(layer((x0, x0)).numpy(), [[8.5, 20.0]])


@pytest.mark.parametrize("low_rank", [0, 2])
def test_cross_network_equals_numpy(low_rank):
    x0 = _batch((6, 5), 5)
    network = CrossNetwork(3, low_rank=low_rank, seed=2)
    network.build((None, 5))
    for layer in network.cross_layers:
        layer.bias.assign(_batch((5,), layer.seed))
    x = x0.astype(np.float64)
    for layer in network.cross_layers:
        x = _numpy_cross(x0.astype(np.float64), x, [w.numpy().astype(np.float64) for w in layer.weights], low_rank)
    np.testing.assert_allclose(network(x0).numpy(), x, rtol=0, atol=TOLERANCE * np.abs(x).max())
    clone = CrossNetwork.from_config(network.get_config())
    assert (clone.num_layers, clone.low_rank, clone.seed) == (3, low_rank, 2)


@pytest.mark.parametrize("embeddings_shape", [(6, 3, 4), (6, 12)])
def test_cross_interaction_crosses_the_bottom_output_beside_the_embeddings(embeddings_shape):
    """NVIDIA's DCNv2 interaction: the cross network over [bottom MLP output, every embedding flat], width kept."""
    from tf_dlrm.models.layers.interaction import CrossInteraction

    bottom, embeddings = _batch((6, 5), 9), _batch(embeddings_shape, 10)
    interaction = CrossInteraction(2, low_rank=3, seed=1)
    interaction.build(((None, 5), (None, *embeddings_shape[1:])))
    network = interaction.cross_network
    for layer in network.cross_layers:
        layer.bias.assign(_batch((17,), layer.seed))
    x0 = np.concatenate([bottom, embeddings.reshape(6, 12)], axis=1).astype(np.float64)
    x = x0
    for layer in network.cross_layers:
        x = _numpy_cross(x0, x, [w.numpy().astype(np.float64) for w in layer.weights], 3)
    assert interaction.compute_output_shape(((None, 5), (None, *embeddings_shape[1:]))) == (None, 17)
    np.testing.assert_allclose(interaction((bottom, embeddings)).numpy(), x, rtol=0, atol=TOLERANCE * np.abs(x).max())


@pytest.mark.parametrize("low_rank", [0, 2])
def test_cross_network_gradient_equals_autodiff_of_its_layers(low_rank):
    """The network's hand-written gradient (x_l = x0 * s_l form) against autodiff of the layers in turn."""
    import tensorflow as tf

    x0 = tf.constant(_batch((6, 5), 7))
    upstream = tf.constant(_batch((6, 5), 8))
    network = CrossNetwork(3, low_rank=low_rank, seed=2)
    network.build((None, 5))
    for layer in network.cross_layers:
        layer.bias.assign(_batch((5,), layer.seed))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x0)
        fused = network(x0)
        x = x0
        for layer in network.cross_layers:
            x = layer((x0, x))
        fused_loss, layers_loss = tf.reduce_sum(fused * upstream), tf.reduce_sum(x * upstream)
    sources = [x0] + network.trainable_weights
    assert len(sources) == 1 + 3 * (3 if low_rank else 2)
    for got, expected in zip(tape.gradient(fused_loss, sources), tape.gradient(layers_loss, sources)):
        expected = expected.numpy()
        # Float32 sums in another order: rounding of the largest term's size.
        np.testing.assert_allclose(got.numpy(), expected, rtol=0, atol=TOLERANCE * max(np.abs(expected).max(), 1.0) * 10)


def test_cross_arguments_are_checked():
    with pytest.raises(ValueError, match="Received: low_rank=-1"):
        CrossLayer(low_rank=-1)
    with pytest.raises(ValueError, match="Received: num_layers=0"):
        CrossNetwork(0)


def test_factorization_machine_equals_pairwise_numpy():
    vectors = _batch((7, 5, 4), 9)
    expected = np.zeros((7, 1))
    v = vectors.astype(np.float64)
    for i in range(5):
        for j in range(i + 1, 5):
            expected[:, 0] += (v[:, i] * v[:, j]).sum(axis=1)
    np.testing.assert_allclose(FactorizationMachine()(vectors).numpy(), expected, rtol=0, atol=TOLERANCE * np.abs(expected).max() * 4)


def test_factorization_machine_by_hand():
    vectors = np.array([[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]], np.float32)
    # <1,2>.<3,4> = 11, <1,2>.<5,6> = 17, <3,4>.<5,6> = 39: 67
    np.testing.assert_allclose(FactorizationMachine()(vectors).numpy(), [[67.0]])


def test_factorization_machine_scale_multiplies_the_term_and_is_serialised():
    vectors = np.array([[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]], np.float32)
    layer = FactorizationMachine(scale=0.25)
    np.testing.assert_allclose(layer(vectors).numpy(), [[67.0 * 0.25]])
    assert FactorizationMachine.from_config(layer.get_config()).scale == 0.25


@pytest.mark.parametrize("scale", [0.0, -1.0, float("inf"), "1"])
def test_factorization_machine_scale_is_checked(scale):
    with pytest.raises(ValueError, match="Received: scale="):
        FactorizationMachine(scale=scale)


def test_linear_term_sums_weights_plus_bias():
    term = LinearTerm()
    weights = _batch((4, 6), 11)
    term.build((None, 6))
    term.bias.assign([0.25])
    expected = weights.astype(np.float64).sum(axis=1, keepdims=True) + 0.25
    np.testing.assert_allclose(term(weights).numpy(), expected, rtol=0, atol=TOLERANCE)


def test_crossed_ids_equal_python_reference():
    rng = np.random.default_rng(3)
    first, second = rng.integers(0, 40_000_000, 500), rng.integers(0, 30_000_000, 500)
    got = crossed_ids(first, second, 30_000_000, 10_007).numpy()
    expected = [crossed_bucket(int(a), int(b), 30_000_000, 10_007) for a, b in zip(first, second)]
    assert got.tolist() == expected
    assert got.min() >= 0 and got.max() < 10_007
    # Neighbouring pairs scatter: 100 pairs in a row take (nearly) 100 buckets.
    assert len(set(crossed_ids(np.zeros(100, np.int64), np.arange(100), 100, 1000).numpy().tolist())) >= 95


def test_crossed_features_parse_and_errors():
    categorical, hotness = ["a", "b", "c"], {"a": 1, "b": 1, "c": 3}
    parsed = parse_crossed_features([{"features": ["a", "b"], "buckets": 10}], categorical, hotness)
    assert parsed == (CrossedFeature("a", "b", 10),) and parsed[0].name == "cross:a*b"
    for entries, message in [
        ([{"features": ["a", "z"], "buckets": 10}], r"crossed_features\[0\].features: 'z' is not a categorical"),
        ([{"features": ["a", "c"], "buckets": 10}], "'c' is multi-hot"),
        ([{"features": ["a", "b"], "buckets": 0}], "Received: buckets=0"),
        ([{"features": ["a"], "buckets": 3}], "expected two categorical feature names"),
        ([{"features": ["a", "b"], "buckets": 3, "size": 2}], "expected keys features, buckets"),
        ([{"features": ["a", "b"], "buckets": 3}, {"features": ["a", "b"], "buckets": 4}], "used twice"),
        ("a*b", "must be a list"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_crossed_features(entries, categorical, hotness, source="spec.yaml")
