"""The dot-interaction kernel inside the real training step: its ops are in the traced step (forward
and backward) in float32 and under mixed_bfloat16; ``--xla`` compiles the plain TensorFlow path
into the training step but evaluation keeps the kernel; a missing library is named in a warning."""

from __future__ import annotations

import os
import sys

import pytest
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_amp_xla import batches_for, small_model  # noqa: E402

from tf_dlrm import ops  # noqa: E402
from tf_dlrm.parallel.env import DistributedEnv  # noqa: E402
from tf_dlrm.models.layers.interaction import interaction_paths  # noqa: E402
from tf_dlrm.optimizers.settings import LearningRateSchedule  # noqa: E402
from tf_dlrm.optimizers.settings import OptimizerConfig  # noqa: E402
from tf_dlrm.train.step import Trainer

KERNEL, GRADIENT = "TfDlrmDotInteraction", "TfDlrmDotInteractionGrad"


def kernel_ops(function, *arguments) -> dict:
    """``{op type: {dtype names}}`` of the interaction kernel's ops in a traced tf.function, looking
    into every function of its library too (custom gradients and conditions live there)."""
    graph_def = function.get_concrete_function(*arguments).graph.as_graph_def()
    nodes = list(graph_def.node) + [node for f in graph_def.library.function for node in f.node_def]
    found = {}
    for node in nodes:
        if node.op in (KERNEL, GRADIENT):
            found.setdefault(node.op, set()).add(tf.as_dtype(node.attr["T"].type).name)
    return found


def trainer_for(policy: str, xla: bool = False) -> tuple[Trainer, tuple]:
    model = small_model(policy=policy)
    config = OptimizerConfig(LearningRateSchedule(0.1))
    trainer = Trainer(model, DistributedEnv(), config, jit_compile=xla)
    features, label = batches_for(model, 1)[0]
    return trainer, ({name: tf.constant(values) for name, values in features.items()}, tf.constant(label))


@pytest.mark.parametrize("policy, dtype, path", [("float32", "float32", "kernel_fp32"), ("mixed_bfloat16", "bfloat16", "kernel_bf16")])
def test_default_training_step_runs_the_kernel_forward_and_backward(policy, dtype, path):
    assert ops.kernels() is not None, f"{ops.LIBRARY} is not built"
    trainer, batch = trainer_for(policy)
    assert kernel_ops(trainer.train_step, *batch) == {KERNEL: {dtype}, GRADIENT: {dtype}}
    trainer.train_step(*batch)  # and it runs
    assert interaction_paths(trainer.model.interaction, xla=False) == {"training": path, "evaluation": path, "reasons": []}


def test_xla_training_uses_plain_tensorflow_but_evaluation_keeps_the_kernel():
    trainer, batch = trainer_for("float32", xla=True)
    assert kernel_ops(trainer.train_step, *batch) == {}
    trainer.train_step(*batch)
    assert kernel_ops(trainer.predict_step, *batch) == {KERNEL: {"float32"}}
    paths = interaction_paths(trainer.model.interaction, xla=True)
    assert paths["training"] == "plain_tf_in_xla" and paths["evaluation"] == "kernel_fp32"
    assert "XLA" in paths["reasons"][0]
    # What main.py logs: the model's own description (the CLI never reads model.interaction).
    described = trainer.model.describe(xla=True)["interaction"]
    assert {k: v for k, v in described.items() if k != "line"} == paths
    assert described["line"].startswith("interaction: training plain_tf_in_xla, evaluation kernel_fp32; ")


def test_kernels_off_traces_plain_tensorflow_only_inside_the_block():
    """The generic switch the XLA step and export use: no model attribute is touched."""
    trainer, batch = trainer_for("float32")
    forward = tf.function(lambda features: trainer.model(features))
    with ops.kernels_off():
        assert ops.kernels() is None
        with ops.kernels_off():  # nested
            pass
        assert ops.kernels() is None
        assert kernel_ops(forward, batch[0]) == {}
    assert ops.kernels() is not None
    assert kernel_ops(tf.function(lambda features: trainer.model(features)), batch[0]) == {KERNEL: {"float32"}}


def test_a_missing_library_is_named_in_a_warning(monkeypatch):
    from absl import logging

    warnings = []
    monkeypatch.setattr(logging, "warning", lambda message, *args: warnings.append(message % args))
    monkeypatch.setattr(ops, "LIBRARY", "/nonexistent/_tf_dlrm_ops.so")
    ops.kernels.cache_clear()
    try:
        assert ops.kernels() is None
        assert len(warnings) == 1 and "/nonexistent/_tf_dlrm_ops.so" in warnings[0], warnings
        model = small_model()
        paths = interaction_paths(model.interaction, xla=False)
        assert paths["training"] == paths["evaluation"] == "plain_tf"
        assert "/nonexistent/_tf_dlrm_ops.so is missing" in paths["reasons"][0]
    finally:
        monkeypatch.undo()
        ops.kernels.cache_clear()
    assert ops.kernels() is not None


def test_float16_falls_back_with_a_reason():
    paths = interaction_paths(small_model(policy="mixed_float16").interaction, xla=False)
    assert paths["training"] == "plain_tf" and "float16" in paths["reasons"][0]
