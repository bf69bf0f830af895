"""A checkpoint saved before a model gained a hyper-parameter restores: only the hyper-parameters it records are
compared (a new one defaults to the model's earlier behaviour); a recorded one that differs is still refused."""

from __future__ import annotations

import pytest


def _identity(config: dict) -> dict:
    return {"name": "dlrm", "config": config, "flags": {"interaction": "interaction"}}


def test_only_the_recorded_hyper_parameters_are_compared(tmp_path):
    from tf_dlrm.checkpoint.store import CheckpointError, SPEC_COPY, check_compatible, model_record
    from tf_dlrm.cli.model_config import ModelConfig
    from tf_dlrm.spec.feature_spec import FeatureSpec

    spec = FeatureSpec.load("feature_specs/synthetic_small.yaml", check_files=False)
    now = {"interaction": "dot", "num_cross_layers": 3, "cross_low_rank": 0}
    saved = model_record(spec, ModelConfig(), _identity({"interaction": "dot"}))  # before the cross layers existed
    (tmp_path / SPEC_COPY).write_text(open("feature_specs/synthetic_small.yaml").read())
    check_compatible(str(tmp_path), {"model": saved}, spec, ModelConfig(), _identity(now))
    with pytest.raises(CheckpointError, match="--interaction: 'dot' in the checkpoint, 'cross' from the flags"):
        check_compatible(str(tmp_path), {"model": saved}, spec, ModelConfig(), _identity({**now, "interaction": "cross"}))
