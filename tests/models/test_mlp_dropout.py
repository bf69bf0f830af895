"""Dropout in the MLPs (``--top_mlp_dropout`` of DLRM, ``--deep_mlp_dropout`` of DCNv2, DeepFM and Wide & Deep):
parsed once into the model's Config, refused naming the flag, active in training only; and layer normalization
(``--top_mlp_layer_norm``, ``--deep_mlp_layer_norm``), checked against numpy.

Evaluation, prediction and export call the model with ``training=False``: their probabilities must be the
same on every call and equal to those of the same weights without dropout. The trainer's ``--xla`` path calls
``dense_call`` outside any Keras call, so it is checked to drop units when it trains.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tf_dlrm.embedding.embedding_bank import EmbeddingBank
from tf_dlrm.embedding.table_config import FeatureConfig, TableConfig
from tf_dlrm.models.dlrm import DLRM
from tf_dlrm.models.layers.mlp import MLP
from tf_dlrm.models.ranking_model import dense_forward


def parse(argv):
    from tf_dlrm.cli import main as cli  # defines main.py's flags on absl's FLAGS
    from tf_dlrm.cli.flags import config_from_flags

    cli.FLAGS.unparse_flags()
    try:
        cli.FLAGS(["main.py", "--dataset_path=/nowhere", *argv])
        return config_from_flags(cli.FLAGS)
    finally:
        cli.FLAGS.unparse_flags()


def test_the_flags_reach_the_model_config():
    assert parse(["--top_mlp_dropout=0.2"]).model.params.top_mlp_dropout == 0.2
    assert parse([]).model.params.top_mlp_dropout == 0.0  # off unless asked: the equivalence tests rely on it
    for model in ("dcnv2", "deepfm", "wide_deep"):
        assert parse([f"--model={model}", "--deep_mlp_dropout=0.3"]).model.params.deep_mlp_dropout == 0.3
        assert parse([f"--model={model}"]).model.params.deep_mlp_dropout == 0.0
    assert parse(["--top_mlp_layer_norm"]).model.params.top_mlp_layer_norm is True
    assert parse(["--model=deepfm", "--deep_mlp_layer_norm"]).model.params.deep_mlp_layer_norm is True
    assert parse(["--model=deepfm"]).model.params.deep_mlp_layer_norm is False
    with pytest.raises(ValueError, match="--deep_mlp_dropout applies to --model=dcnv2, deepfm, wide_deep only. "
                                         "Received: --model=dlrm"):
        parse(["--deep_mlp_dropout=0.1"])


@pytest.mark.parametrize("argv,flag,shown", [
    (["--top_mlp_dropout=-0.1"], "top_mlp_dropout", "-0.1"),
    (["--top_mlp_dropout=1"], "top_mlp_dropout", "1.0"),
    (["--model=dcnv2", "--deep_mlp_dropout=1.5"], "deep_mlp_dropout", "1.5"),
    (["--model=wide_deep", "--deep_mlp_dropout=nan"], "deep_mlp_dropout", "nan"),
])
def test_bad_rates_are_refused_naming_the_flag(argv, flag, shown):
    expected = f"Expected --{flag} in [0, 1) (the fraction of hidden units zeroed in training). Received: --{flag}={shown}"
    with pytest.raises(ValueError) as raised:
        parse(argv)
    assert str(raised.value) == expected


def test_mlp_drops_hidden_units_in_training_only():
    x = tf.constant(np.random.default_rng(0).normal(size=(64, 6)), tf.float32)
    dropping, plain = MLP((32, 32, 1), final_activation=None, seed=3, dropout=0.5), MLP((32, 32, 1), final_activation=None, seed=3)
    dropping.build(x.shape)
    plain.build(x.shape)
    for mine, theirs in zip(dropping.weights, plain.weights):  # the same seeded initial weights
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    expected = plain(x).numpy()
    for training in (False, None):
        np.testing.assert_array_equal(dropping(x, training=training).numpy(), expected)
    assert not np.allclose(dropping(x, training=True).numpy(), expected)
    assert MLP((4, 1), dropout=0.5).get_config()["dropout"] == 0.5
    with pytest.raises(ValueError, match=r"Expected an MLP dropout rate in \[0, 1\). Received: dropout=1.0"):
        MLP((4, 1), dropout=1.0)


def dlrm_and_inputs(rate):
    model = DLRM(EmbeddingBank([10, 20], 4, seed=1), num_numerical=3, bottom_mlp_dims=[8, 4], top_mlp_dims=[16, 16, 1],
                 top_mlp_dropout=rate, seed=2)
    rng = np.random.default_rng(0)
    inputs = {"numerical": rng.normal(size=(32, 3)).astype(np.float32), "t0": rng.integers(0, 10, 32), "t1": rng.integers(0, 20, 32)}
    return model, inputs


def family_and_inputs(name, rate):
    from model_families import build_family_model
    from tf_dlrm.sharding.planner import make_plan

    tables = [TableConfig("a", 10, 4), TableConfig("b", 20, 4)]
    features = [FeatureConfig("a", "a"), FeatureConfig("b", "b")]
    _, model = build_family_model(name, {"deep_mlp_dims": (16, 16), "deep_mlp_dropout": rate}, tables, features, [],
                                  lambda specs: make_plan(specs, 1, "table_wise"), 3, 0, seed=4)
    rng = np.random.default_rng(0)
    return model, {"numerical": rng.normal(size=(32, 3)).astype(np.float32), "a": rng.integers(0, 10, 32),
                   "b": rng.integers(0, 20, 32)}


@pytest.mark.parametrize("name", ["dlrm", "dcnv2", "deepfm", "wide_deep"])
def test_models_drop_out_in_training_and_never_in_evaluation(name):
    make = dlrm_and_inputs if name == "dlrm" else (lambda rate: family_and_inputs(name, rate))
    model, inputs = make(0.5)
    plain, _ = make(0.0)
    model(inputs)
    plain(inputs)
    for mine, theirs in zip(plain.weights, model.weights):
        mine.assign(theirs)
    # Evaluation, prediction and export (training=False, or Keras' default): the same probabilities every
    # time, those of the same weights without dropout.
    expected = tf.sigmoid(plain(inputs, training=False)).numpy()
    for _ in range(2):
        np.testing.assert_array_equal(tf.sigmoid(model(inputs, training=False)).numpy(), expected)
        np.testing.assert_array_equal(tf.sigmoid(model(inputs)).numpy(), expected)
    # Training: through Keras' call (the trainer without --xla) and through dense_forward (its --xla path).
    assert not np.allclose(model(inputs, training=True).numpy(), plain(inputs, training=True).numpy())
    embeddings = model.embed(inputs, training=False)
    numerical = inputs["numerical"]
    assert not np.allclose(dense_forward(model, numerical, embeddings, training=True).numpy(),
                           dense_forward(plain, numerical, embeddings, training=True).numpy())
    np.testing.assert_array_equal(dense_forward(model, numerical, embeddings, training=False).numpy(),
                                  dense_forward(plain, numerical, embeddings, training=False).numpy())
    # The config round-trips (checkpoints and SavedModels rebuild the model from it).
    assert type(model).from_config(model.get_config()).model_config == model.model_config


def test_layer_norm_normalizes_each_hidden_layer_before_its_relu():
    x = np.random.default_rng(1).normal(size=(5, 6)).astype(np.float32)
    mlp = MLP((8, 1), final_activation=None, seed=3, layer_norm=True)
    mlp.build(x.shape)
    hidden, logit = mlp.dense_layers
    norm = mlp.norm_layers[0]
    norm.gamma.assign(np.linspace(0.5, 2.0, 8).astype(np.float32))
    norm.beta.assign(np.linspace(-0.3, 0.3, 8).astype(np.float32))
    pre = x @ hidden.kernel.numpy() + hidden.bias.numpy()
    mean, variance = pre.mean(axis=1, keepdims=True), pre.var(axis=1, keepdims=True)
    normalized = (pre - mean) / np.sqrt(variance + norm.epsilon) * norm.gamma.numpy() + norm.beta.numpy()
    expected = np.maximum(normalized, 0.0) @ logit.kernel.numpy() + logit.bias.numpy()
    np.testing.assert_allclose(mlp(x).numpy(), expected, rtol=1e-5, atol=1e-5)
    assert len(mlp.norm_layers) == 1 and MLP((4, 1), layer_norm=True).get_config()["layer_norm"] is True
