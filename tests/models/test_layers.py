"""DLRM layers on small hand-computed numbers."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_dlrm.models.dlrm import DLRM, DLRMConfig
from tf_dlrm.embedding.embedding_bank import EmbeddingBank
from tf_dlrm.models.layers.interaction import CatInteraction, DotInteraction, lower_triangle_indices
from tf_dlrm.models.layers.mlp import MLP
from tf_dlrm.embedding.table_init import initial_table_slice


def test_dot_interaction_strict_lower_triangle_by_hand():
    bottom = np.array([[1.0, 2.0]], np.float32)
    embeddings = np.array([[[3.0, 4.0], [5.0, 6.0]]], np.float32)
    out = DotInteraction()((bottom, embeddings)).numpy()
    # vectors x0=(1,2), x1=(3,4), x2=(5,6): pairs (1,0)=11, (2,0)=17, (2,1)=39
    np.testing.assert_allclose(out, [[1.0, 2.0, 11.0, 17.0, 39.0]])


def test_dot_interaction_with_diagonal_by_hand():
    bottom = np.array([[1.0, 2.0]], np.float32)
    embeddings = np.array([[[3.0, 4.0]]], np.float32)
    out = DotInteraction(include_diagonal=True)((bottom, embeddings)).numpy()
    # (0,0)=5, (1,0)=11, (1,1)=25
    np.testing.assert_allclose(out, [[1.0, 2.0, 5.0, 11.0, 25.0]])


def test_lower_triangle_indices_rows_in_order():
    assert lower_triangle_indices(3, False).tolist() == [3, 6, 7]
    assert lower_triangle_indices(3, True).tolist() == [0, 3, 4, 6, 7, 8]


def test_cat_interaction_concatenates():
    bottom = np.ones((2, 3), np.float32)
    embeddings = np.arange(2 * 2 * 4, dtype=np.float32).reshape(2, 2, 4)
    out = CatInteraction()((bottom, embeddings)).numpy()
    assert out.shape == (2, 3 + 8)
    np.testing.assert_array_equal(out[:, 3:], embeddings.reshape(2, 8))


def test_dot_interaction_rejects_mismatched_widths():
    with pytest.raises(ValueError, match="bottom MLP's last width"):
        DotInteraction()((np.ones((1, 3), np.float32), np.ones((1, 2, 4), np.float32)))


def test_mlp_shapes_activation_and_config():
    mlp = MLP([4, 1], final_activation=None, seed=7)
    out = mlp(np.ones((5, 3), np.float32))
    assert out.shape == (5, 1)
    clone = MLP.from_config(mlp.get_config())
    assert clone.units == (4, 1) and clone.seed == 7 and clone.final_activation is None
    with pytest.raises(ValueError, match="Received: units=\\[4, 0\\]"):
        MLP([4, 0])


def test_mlp_same_seed_same_weights():
    first, second = MLP([8, 2], seed=3), MLP([8, 2], seed=3)
    x = np.random.default_rng(0).random((4, 5), dtype=np.float32)
    np.testing.assert_array_equal(first(x).numpy(), second(x).numpy())


def test_table_init_independent_of_slicing():
    full = initial_table_slice(seed=5, table=2, rows=40000, dim=7)
    left = initial_table_slice(seed=5, table=2, rows=40000, dim=7, column_start=0, column_end=3)
    right = initial_table_slice(seed=5, table=2, rows=40000, dim=7, column_start=3, column_end=7)
    np.testing.assert_array_equal(np.concatenate([left, right], axis=1), full)
    assert np.abs(full).max() <= 1 / np.sqrt(40000)
    assert not np.array_equal(full, initial_table_slice(seed=5, table=3, rows=40000, dim=7))


def test_embedding_bank_lookup_and_full_tables():
    bank = EmbeddingBank([10, 20], 4, seed=1)
    ids = {"t0": np.array([1, 9], np.int32), "t1": np.array([0, 19], np.int32)}
    out = bank(ids, stacked=True).numpy()
    assert out.shape == (2, 2, 4)
    np.testing.assert_array_equal(out[1, 1], bank.get_full_table(1)[19])
    np.testing.assert_array_equal(bank(ids)["t1"].numpy(), out[:, 1])
    bank.set_full_table(0, np.full((10, 4), 2.0, np.float32))
    np.testing.assert_array_equal(bank(ids, stacked=True).numpy()[:, 0], np.full((2, 4), 2.0))
    with pytest.raises(TypeError, match="Expected a dict of feature name -> ids. Received: tuple"):
        bank(tuple(ids.values()))


def features(numerical, t0, t1) -> dict:
    """The model's inputs: the numerical features and the ids of the bank's features ``t0`` and ``t1``."""
    return {"numerical": numerical, "t0": t0, "t1": t1}


def make_dlrm(**overrides):
    kwargs = dict(num_numerical=3, bottom_mlp_dims=[8, 4], top_mlp_dims=[8, 1], seed=2)
    kwargs.update(overrides)
    return DLRM(EmbeddingBank([10, 20], 4, seed=1), **kwargs)


def test_dlrm_forward_shape_and_float32_logits():
    model = make_dlrm()
    logits = model(features(np.ones((6, 3), np.float32), np.zeros(6, np.int32), np.ones(6, np.int32)))
    assert logits.shape == (6, 1) and logits.dtype == tf.float32


def test_dlrm_checks_bottom_width_against_embedding_dim():
    with pytest.raises(ValueError, match="bottom_mlp_dims=\\[8, 5\\], embedding_dim=4"):
        make_dlrm(bottom_mlp_dims=[8, 5])


def test_dlrm_top_mlp_must_end_in_one_unit():
    with pytest.raises(ValueError, match="--top_mlp_dims to end with 1"):
        make_dlrm(top_mlp_dims=[8, 2])


def test_dlrm_cat_interaction_allows_any_bottom_width():
    model = make_dlrm(bottom_mlp_dims=[8, 5], interaction="cat")
    assert model(features(np.ones((2, 3), np.float32), np.zeros(2, np.int32), np.zeros(2, np.int32))).shape == (2, 1)


def test_dlrm_mixed_bfloat16_keeps_tables_float32():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = make_dlrm()
        logits = model(features(np.ones((2, 3), np.float32), np.zeros(2, np.int32), np.zeros(2, np.int32)))
        assert logits.dtype == tf.float32
        assert all(v.dtype == "float32" for v in model.embedding.tables)
        assert model.embedding.compute_dtype == "bfloat16"
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_dlrm_get_config_round_trip():
    model = make_dlrm(interaction="cat", include_diagonal=False)
    config = model.get_config()
    clone = DLRM.from_config(config)
    assert clone.model_config == DLRMConfig(bottom_mlp_dims=(8, 4), top_mlp_dims=(8, 1), interaction="cat")
    assert clone.embedding.cardinalities == (10, 20)
