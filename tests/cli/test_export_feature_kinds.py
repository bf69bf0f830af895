"""``--mode=export``'s serving module for every ``--model`` (DLRM, DCNv2, DeepFM, Wide & Deep, logistic
regression) and every kind of feature, in one process.

Each model is rebuilt as ``--mode=export`` rebuilds it (:func:`tf_dlrm.cli.export.rebuild_for_serving`: one
process, every table whole) on a spec holding every fixed-table feature kind at once: a
one-hot feature, a second one-hot feature of another table width (per-table widths: the spec's ``embedding_dim``
and NVIDIA's ``--embedding_dim`` list), a fixed multi-hot one (``hotness: 3``, ``sum``) and a ragged one
(0 to 4 ids, ``mean``, empty rows included), and saved with ``_save`` as the export saves it, under the one
signature of :mod:`tf_dlrm.embedding.serving` (one input per feature, from the spec:
:func:`tf_dlrm.cli.export.serving_signature`). The reloaded
signature must score a batch exactly as the Keras model scores the same features: a column given to the wrong
feature, a ragged row split at the wrong place or a dropped width would change the scores by far more than
the float32 rounding of one graph run twice (1e-6). Models that need one table width (DLRM's dot interaction,
DeepFM's FM term) take one width here and are refused per-table widths with one line. The SavedModel holds
no tf_dlrm kernel (traced inside kernels_off; a process without tf_dlrm serves the exports of
``test_export_multi_hot.py``). Dynamic tables: ``test_export_multi_hot.py`` (a trained checkpoint)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tf_dlrm.cli import builder
from tf_dlrm.cli.export import SERVING_INFO, _save, model_signature, rebuild_for_serving, serving_info
from tf_dlrm.embedding.serving import serving_module
from tf_dlrm.cli.model_config import ModelConfig
from tf_dlrm.models.dcnv2 import DCNv2Config
from tf_dlrm.models.deepfm import DeepFMConfig
from tf_dlrm.models.dlrm import DLRMConfig
from tf_dlrm.models.wide_deep import WideDeepConfig
from tf_dlrm.spec.feature_spec import FeatureSpec

ROWS = {"site": 50, "city": 30, "tags": 40, "history": 60}
HOTNESS = {"tags": 3, "history": 4}
BATCH = 9
# In-process, but five SavedModels written and loaded: kept out of the unit tier's minute.
pytestmark = pytest.mark.integration


def spec_of(widths: dict | None = None) -> FeatureSpec:
    features = {"label": {"dtype": "bool"}, "n0": {"dtype": "float32"}, "n1": {"dtype": "float32"},
                "site": {"dtype": "int32", "cardinality": ROWS["site"]},
                "city": {"dtype": "int32", "cardinality": ROWS["city"]},
                "tags": {"dtype": "int32", "cardinality": ROWS["tags"], "hotness": 3},
                "history": {"dtype": "int32", "cardinality": ROWS["history"], "hotness": 4, "ragged": True,
                            "combiner": "mean"}}
    for name, width in (widths or {}).items():
        features[name]["embedding_dim"] = width
    raw = {"feature_spec": features,
           "channel_spec": {"label": ["label"], "numerical": ["n0", "n1"], "categorical": list(ROWS)}}
    return FeatureSpec.from_dict(raw, source="kinds.yaml")


# Per model: its config, and the table widths it takes (one for the models whose interaction needs one).
MODELS = {
    "dlrm": (DLRMConfig(bottom_mlp_dims=(8, 4), top_mlp_dims=(8, 1)), None),
    "dlrm_cat": (DLRMConfig(bottom_mlp_dims=(8, 4), top_mlp_dims=(8, 1), interaction="cat"), {"site": 6, "city": 3}),
    "dcnv2": (DCNv2Config(num_cross_layers=2, cross_low_rank=3, deep_mlp_dims=(8,)), {"site": 6, "city": 3, "tags": 5}),
    "deepfm": (DeepFMConfig(deep_mlp_dims=(8,)), None),
    "wide_deep": (WideDeepConfig(deep_mlp_dims=(8,)), {"site": 6, "city": 3}),
    "logistic_regression": (None, None),  # no hyper-parameters; every table of width 1
}


def batch(seed: int) -> tuple[dict, dict]:
    """``(signature inputs, the model's own input)`` of one batch: ragged rows of 0 to 4 ids (one empty)."""
    rng = np.random.default_rng(seed)
    numerical = rng.normal(size=[BATCH, 2]).astype(np.float32)
    site, city = rng.integers(0, ROWS["site"], BATCH), rng.integers(0, ROWS["city"], BATCH)
    tags = rng.integers(0, ROWS["tags"], [BATCH, 3])
    lengths = rng.integers(0, 5, BATCH)
    lengths[:3] = [0, 4, 1]
    values = rng.integers(0, ROWS["history"], int(lengths.sum()))
    inputs = {"numerical": numerical, "site": site.astype(np.int64), "city": city.astype(np.int64),
              "tags": tags.astype(np.int64), "history_values": values.astype(np.int64),
              "history_row_lengths": lengths.astype(np.int64)}
    history = tf.RaggedTensor.from_row_lengths(tf.constant(values, tf.int64), tf.constant(lengths, tf.int64))
    own = {"numerical": tf.constant(numerical), "site": tf.constant(site, tf.int64), "city": tf.constant(city, tf.int64),
           "tags": tf.constant(tags, tf.int64), "history": history}
    return inputs, own


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """``{model: (served scores, Keras scores, serving info)}``: every model exported and reloaded."""
    results = {}
    for name, (params, widths) in MODELS.items():
        spec = spec_of(widths)
        config = ModelConfig(embedding_dim=4, name=name.split("_cat")[0], params=params, embedding_init_bound=0.5)
        model = rebuild_for_serving(spec, config, seed=3)
        module = serving_module(model, model_signature(spec, model))
        path = str(tmp_path_factory.mktemp(name) / "saved_model")
        _save(module, path, serving_info(spec, module, name))
        inputs, own = batch(seed=len(results))
        expected = tf.reshape(tf.sigmoid(model(own, training=False)), [-1]).numpy()
        served = tf.saved_model.load(path).signatures["serving_default"]
        scores = served(**{k: tf.constant(v) for k, v in inputs.items()})["probability"].numpy()
        with open(os.path.join(path, SERVING_INFO)) as handle:
            results[name] = (scores, expected, json.load(handle), [t.embedding_dim for t in builder.model_tables(spec, config)],
                             served)
    return results


@pytest.mark.parametrize("name", list(MODELS))
def test_every_model_serves_every_feature_kind_as_it_scores(exported, name):
    scores, expected, info, widths, _ = exported[name]
    assert scores.shape == expected.shape == (BATCH,)
    np.testing.assert_allclose(scores, expected, rtol=0, atol=1e-6)
    assert expected.std() > 1e-4, expected  # the batch's rows score differently: a swapped column would show
    assert list(info["inputs"]) == ["numerical", "site", "city", "tags", "history_values", "history_row_lengths"]
    assert info["inputs"]["numerical"] == {"dtype": "float32", "shape": [None, 2], "features": ["n0", "n1"]}
    assert info["inputs"]["site"] == {"dtype": "int64", "shape": [None], "feature": "site", "hotness": 1,
                                      "ragged": False, "cardinality": ROWS["site"]}
    assert info["inputs"]["tags"]["shape"] == [None, 3]
    assert info["inputs"]["history_values"]["feature"] == info["inputs"]["history_row_lengths"]["feature"] == "history"
    assert info["outputs"] == {"probability": {"dtype": "float32", "shape": [None]}}
    wanted = MODELS[name][1] or {}
    assert widths[:4] == ([1] * 4 if name == "logistic_regression" else [wanted.get(f, 4) for f in ROWS]), widths


def test_each_served_feature_moves_the_score(exported):
    """The multi-hot ids and the ragged rows reach the model: other tags or another history change the score,
    except for sample 0, whose history is empty (a mean of no vectors is zeros) whatever the other rows hold."""
    served = exported["dcnv2"][4]
    inputs = {k: tf.constant(v) for k, v in batch(seed=0)[0].items()}
    base = served(**inputs)["probability"].numpy()
    for name, rows in (("tags", ROWS["tags"]), ("history_values", ROWS["history"])):
        moved = served(**{**inputs, name: (inputs[name] + 1) % rows})["probability"].numpy()
        changed = np.abs(moved - base) > 1e-6
        assert changed[1:].all(), (name, moved - base)
        assert changed[0] == (name == "tags"), (name, moved - base)


@pytest.mark.parametrize("name, message", [
    ("dlrm", "The dot interaction needs one width for every embedding table"),
    ("deepfm", "DeepFM's FM term needs one width for every deep table"),
])
def test_models_of_one_width_refuse_per_table_widths(name, message):
    params = MODELS[name][0]
    with pytest.raises(ValueError, match=message):
        rebuild_for_serving(spec_of({"site": 6, "city": 3}), ModelConfig(embedding_dim=4, name=name, params=params), seed=3)
