"""Non-finite losses and scores: the step, the rates and the last finite loss are named; no AUC from NaN."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tf_dlrm.train.guards import LossWatch, NonFiniteError, check_scores, non_finite_arrays


def test_loss_watch_names_the_first_non_finite_step_and_the_last_finite_loss():
    watch = LossWatch(first_step=10)
    for value in (0.7, 0.6):
        watch.add(np.float32(value))
    assert watch.read("learning rate 1") == pytest.approx(0.6)
    for value in (0.5, 0.4, math.inf, math.nan):
        watch.add(np.float32(value))
    with pytest.raises(NonFiniteError, match=r"training loss is inf at step 15 \(learning rate 1\); "
                                             r"the last finite loss was 0\.4 at step 14"):
        watch.read("learning rate 1")


def test_loss_watch_remembers_the_last_finite_loss_of_an_earlier_window():
    watch = LossWatch()
    watch.add(np.float32(0.25))
    watch.read("learning rate 2")
    watch.add(np.float32(math.nan))
    with pytest.raises(NonFiniteError, match=r"at step 2 .*the last finite loss was 0\.25 at step 1"):
        watch.read("learning rate 2")


def test_no_auc_from_non_finite_scores():
    check_scores(np.array([0.1, 0.9], np.float32), "evaluation")
    with pytest.raises(NonFiniteError, match=r"evaluation at step 4: 1 of 3 predicted scores are NaN or inf"):
        check_scores(np.array([0.1, np.nan, 0.3], np.float32), "evaluation at step 4")


def test_evaluate_of_a_model_with_nan_weights_refuses(tmp_path):
    """The real evaluation path: a DLRM whose top layer holds a NaN gives no AUC."""
    from tiny_dataset import write_tiny

    from tf_dlrm.parallel.env import DistributedEnv
    from tf_dlrm.spec.feature_spec import FeatureSpec
    from tf_dlrm.cli import builder
    from tf_dlrm.cli.model_config import ModelConfig, ShardingConfig
    from tf_dlrm.train.loop import evaluate
    from tf_dlrm.optimizers.settings import LearningRateSchedule
    from tf_dlrm.optimizers.settings import OptimizerConfig
    from tf_dlrm.train.step import Trainer

    data = write_tiny(tmp_path / "data")
    spec = FeatureSpec.load(str(data) + "/feature_spec.yaml")
    env = DistributedEnv(rank=0, world_size=1, local_rank=0, local_size=1)
    from tf_dlrm.models.dlrm import DLRMConfig

    model_config = ModelConfig(embedding_dim=4, params=DLRMConfig(bottom_mlp_dims=(8, 4), top_mlp_dims=(8, 1)))
    plan = builder.make_sharding_plan(spec, model_config, ShardingConfig(), 1)
    model = builder.build_model(spec, plan, model_config, env, seed=1)
    trainer = Trainer(model, env, OptimizerConfig(LearningRateSchedule(0.1)))
    reader = builder.make_reader(spec, "test", 256, env, model.input_modes, False, 1)
    assert 0 < evaluate(trainer, reader).auc < 1
    kernel = trainer.mlp[-2]
    kernel.assign(np.full(kernel.shape, np.nan, np.float32))
    with pytest.raises(NonFiniteError, match="no AUC is reported"):
        evaluate(trainer, reader)


def test_non_finite_arrays_are_named():
    arrays = [("a", np.zeros(3)), ("b", np.array([1.0, np.inf])), ("c", np.array([np.nan]))]
    assert non_finite_arrays(arrays) == ["b", "c"]
