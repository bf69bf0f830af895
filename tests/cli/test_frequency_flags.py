"""``--embedding_min_count`` and ``--embedding_frequency_l2``: parsed once into ModelConfig, put on every table's
TableConfig as its FrequencyRegularizer, refused naming the flag."""

from __future__ import annotations

import os

import pytest

from conftest import REPO
from tf_dlrm.cli.model_config import ModelConfig
from tf_dlrm.embedding import FrequencyRegularizer


def parse(argv):
    from tf_dlrm.cli import main as cli  # defines main.py's flags on absl's FLAGS
    from tf_dlrm.cli.flags import config_from_flags

    cli.FLAGS.unparse_flags()
    cli.FLAGS(["main.py", "--dataset_path=/nowhere", *argv])
    return config_from_flags(cli.FLAGS)


def test_the_flags_reach_the_model_config():
    model = parse(["--embedding_min_count=3", "--embedding_frequency_l2=0.2"]).model
    assert model.frequency_regularizer == FrequencyRegularizer(l2=0.2, min_count=3)
    assert ModelConfig(embedding_frequency_l2=0.0, embedding_min_count=1).frequency_regularizer is None


@pytest.mark.parametrize("argv,message", [
    (["--embedding_min_count=0"], "Received: --embedding_min_count=0"),
    (["--embedding_min_count=-2"], "Received: --embedding_min_count=-2"),
    (["--embedding_frequency_l2=-0.5"], "Expected --embedding_frequency_l2 >= 0. Received: --embedding_frequency_l2=-0.5"),
    (["--embedding_frequency_l2=inf"], "Received: --embedding_frequency_l2=inf"),
])
def test_bad_values_are_refused_naming_the_flag(argv, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("(", r"\(").replace(")", r"\)")):
        parse(argv)


def test_every_table_of_main_py_gets_the_regularizer():
    from tf_dlrm.cli.builder import make_table_configs
    from tf_dlrm.spec.feature_spec import FeatureSpec

    spec = FeatureSpec.load(os.path.join(REPO, "feature_specs", "synthetic_small.yaml"), check_files=False)
    model = parse(["--embedding_dim=4", "--bottom_mlp_dims=8,4", "--embedding_min_count=2",
                   "--embedding_frequency_l2=0.1"]).model
    tables = make_table_configs(spec, None, model)
    assert tables and {t.frequency_regularizer for t in tables} == {FrequencyRegularizer(l2=0.1, min_count=2)}


@pytest.mark.parametrize("argv,expected", [
    # DCNv2's default (its default_frequency_regularizer) when neither flag is given ...
    (["--model=dcnv2"], FrequencyRegularizer(l2=25.0, min_count=2)),
    # ... which either flag replaces, the other keeping its flag's default
    (["--model=dcnv2", "--embedding_frequency_l2=0"], None),
    (["--model=dcnv2", "--embedding_min_count=3"], FrequencyRegularizer(l2=0.0, min_count=3)),
    (["--model=dcnv2", "--embedding_frequency_l2=0.5"], FrequencyRegularizer(l2=0.5, min_count=1)),
    # The other models have none.
    (["--model=dlrm"], None),
    (["--model=deepfm"], None),
    (["--model=wide_deep"], None),
])
def test_a_model_may_default_to_its_own_regularizer(argv, expected):
    assert parse(argv).model.frequency_regularizer == expected
