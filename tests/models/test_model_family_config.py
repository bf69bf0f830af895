"""--model and its flags: each model's config, the tables and features it reads, the built models."""

from __future__ import annotations

import numpy as np
import pytest

from tf_dlrm.spec.crossed_features import CrossedFeature
from tf_dlrm.embedding.table_config import FeatureConfig, TableConfig
from tf_dlrm.models import registry


def test_model_configs_check_every_flag():
    from tf_dlrm.models.dcnv2 import DCNv2Config
    from tf_dlrm.models.dlrm import DLRMConfig
    from tf_dlrm.models.wide_deep import WideDeepConfig

    # The message lists every registered model (whatever files tf_dlrm/models/ holds).
    with pytest.raises(ValueError, match=r"Expected --model to be one of \[.*'dcnv2', 'deepfm', 'dlrm'.*\] or an import path "
                                         r"package.module:Class. Received: --model='dcn'"):
        registry.lookup("dcn")
    for config, kwargs, message in [
        (DCNv2Config, {"cross_structure": "side"}, "--cross_structure"),
        (DCNv2Config, {"num_cross_layers": 0}, "Received: --num_cross_layers=0"),
        (DCNv2Config, {"cross_low_rank": -2}, "Received: --cross_low_rank=-2"),
        (DCNv2Config, {"deep_mlp_dims": (16, 0)}, r"Received: --deep_mlp_dims=\[16, 0\]"),
        (DCNv2Config, {"deep_mlp_dims": ()}, "--deep_mlp_dims"),
        (WideDeepConfig, {"wide_optimizer": "adam"}, "--wide_optimizer"),
        (DLRMConfig, {"top_mlp_dims": (8, 2)}, "--top_mlp_dims to end with 1"),
        (DLRMConfig, {"interaction": "fm"}, r"--interaction in \['dot', 'cat', 'cross'\]. Received: 'fm'"),
        (DLRMConfig, {"interaction": "cross", "num_cross_layers": 0}, "Received: --num_cross_layers=0"),
    ]:
        with pytest.raises(ValueError, match=message):
            config(**kwargs)
    # Before any table exists: DLRM's dot interaction needs the bottom MLP to end at the tables' width.
    with pytest.raises(ValueError, match="Received: --bottom_mlp_dims=512,256,128, --embedding_dim=16"):
        registry.lookup("dlrm").tables(DLRMConfig(), [TableConfig("a", 10, 16)])


BASE_TABLES = [TableConfig("a", 10, 4), TableConfig("b", 20, 4), TableConfig("c", 30, 4)]
BASE_FEATURES = [FeatureConfig("a", "a"), FeatureConfig("b", "b", hotness=3, combiner="mean"), FeatureConfig("c", "c")]
CROSSED = [CrossedFeature("a", "c", 7)]


@pytest.mark.parametrize("model,names", [
    ("dlrm", ["a", "b", "c"]),
    ("dcnv2", ["a", "b", "c"]),
    ("deepfm", ["a", "b", "c", "linear:a", "linear:b", "linear:c"]),
    ("wide_deep", ["a", "b", "c", "linear:a", "linear:b", "linear:c", "cross:a*c"]),
])
def test_each_model_reads_its_tables(model, names):
    cls = registry.lookup(model)
    config = cls.make_config({"bottom_mlp_dims": [8, 4]} if model == "dlrm" else {})
    tables = cls.tables(config, BASE_TABLES, CROSSED)
    assert [t.name for t in tables] == names
    assert all(t.embedding_dim == 1 for t in tables[3:]) and [t.vocabulary_size for t in tables[3:6]] in ([], [10, 20, 30])
    features, sources = cls.features(config, BASE_FEATURES, CROSSED)
    assert [f.table for f in features] == names
    if model in ("deepfm", "wide_deep"):
        # The first-order / wide feature of b pools b's ids the way b does.
        assert (features[4].hotness, features[4].combiner, sources[4]) == (3, "mean", ("column", 1))
    if model == "wide_deep":
        assert sources[-1] == ("cross", 0, 2) and tables[-1].vocabulary_size == 7


def test_crossed_features_import_no_tensorflow():
    # The model configs live in tf_dlrm.models, whose __init__ imports the models (TensorFlow); the
    # crossed features are part of the FeatureSpec, which stays free of it.
    import subprocess
    import sys

    code = "import sys, tf_dlrm.spec.crossed_features; sys.exit('tensorflow' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_crossed_features_too_large_are_refused():
    big = [TableConfig("a", 2**40, 4), TableConfig("b", 2**30, 4)]
    with pytest.raises(ValueError, match="exceed 2\\^62 pairs"):
        cls = registry.lookup("wide_deep")
        cls.tables(cls.Config(), big, [CrossedFeature("a", "b", 5)])


def test_flags_select_the_model():
    from tf_dlrm.cli import main as cli  # noqa: F401  (defines main.py's flags)
    from tf_dlrm.cli.flags import config_from_flags

    cli.FLAGS.unparse_flags()
    cli.FLAGS(["main.py", "--dataset_type=synthetic", "--model=dcnv2", "--num_cross_layers=2", "--cross_low_rank=8",
               "--cross_structure=parallel", "--deep_mlp_dims=64,32", "--embedding_dim=16"])
    from tf_dlrm.models.dcnv2 import DCNv2Config

    model = config_from_flags(cli.FLAGS).model
    assert (model.name, model.params) == ("dcnv2", DCNv2Config(2, 8, "parallel", (64, 32)))
    cli.FLAGS.unparse_flags()
    # A flag of another model is refused, naming the models it belongs to.
    cli.FLAGS(["main.py", "--dataset_type=synthetic", "--model=dlrm", "--cross_structure=parallel"])
    with pytest.raises(ValueError, match="--cross_structure applies to --model=dcnv2 only. Received: --model=dlrm"):
        config_from_flags(cli.FLAGS)
    cli.FLAGS.unparse_flags()


def test_spec_crossed_features_round_trip_and_errors(tmp_path):
    from tf_dlrm.spec.feature_spec import FeatureSpec
    from tf_dlrm.spec.format import FeatureSpecError

    raw = {"feature_spec": {"label": {"dtype": "bool"}, "x": {"dtype": "int32", "cardinality": 5},
                            "y": {"dtype": "int32", "cardinality": 6}},
           "channel_spec": {"label": ["label"], "numerical": [], "categorical": ["x", "y"]},
           "crossed_features": [{"features": ["x", "y"], "buckets": 9}]}
    spec = FeatureSpec.from_dict(raw, source="spec.yaml")
    assert spec.crossed_features == (CrossedFeature("x", "y", 9),)
    assert FeatureSpec.from_dict(spec.to_dict()).crossed_features == spec.crossed_features
    raw["crossed_features"] = [{"features": ["x", "q"], "buckets": 9}]
    with pytest.raises(FeatureSpecError, match=r"spec.yaml: crossed_features\[0\].features: 'q' is not a categorical"):
        FeatureSpec.from_dict(raw, source="spec.yaml")


@pytest.mark.parametrize("model", ["dcnv2", "deepfm", "wide_deep"])
def test_models_serialise_and_predict_alike(model):
    import keras

    from model_families import build_family_model
    from tf_dlrm.sharding.planner import make_plan

    params = {"deep_mlp_dims": (8,), **({"num_cross_layers": 2} if model == "dcnv2" else {})}
    _, network = build_family_model(model, params, BASE_TABLES, BASE_FEATURES, CROSSED,
                                    lambda tables: make_plan(tables, 1, "table_wise"), 3, 0, seed=4)
    rng = np.random.default_rng(0)
    inputs = {"numerical": rng.normal(size=(5, 3)).astype(np.float32),
              "a": rng.integers(0, 10, 5), "b": rng.integers(0, 20, (5, 3)), "c": rng.integers(0, 30, 5)}
    logits = network(inputs)
    assert logits.shape == (5, 1) and logits.dtype == "float32"
    clone = type(network).from_config(network.get_config())
    clone(inputs)
    for mine, theirs in zip(clone.weights, network.weights):
        mine.assign(theirs)
    np.testing.assert_allclose(clone(inputs).numpy(), logits.numpy(), rtol=0, atol=1e-6)
    assert keras.saving.get_registered_name(type(network)).startswith("tf_dlrm>")
    assert clone.model_config == network.model_config and clone.num_categorical == 3
