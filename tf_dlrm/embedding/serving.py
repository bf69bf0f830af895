"""A SavedModel of a model holding distributed embeddings, served by plain TensorFlow (no tf_dlrm import).

    model = build_my_model()                       # one process (TF_DLRM_DISABLE_KERNELS=1, see below)
    tf_dlrm.checkpoint.model_checkpoint.restore(model, "runs/ckpt")   # saved by any number of ranks
    export_saved_model(model, "serving/1", {"item": tf.TensorSpec([None], tf.int64), ...})

    loaded = tf.saved_model.load("serving/1")     # in any TensorFlow process
    loaded.signatures["serving_default"](item=..., history_values=..., history_row_lengths=..., ...)

The serving signature takes one tensor per dense input; a ragged input ``name`` (a
``tf.RaggedTensorSpec``) becomes two: ``name_values`` (the ids of every row, concatenated) and
``name_row_lengths`` (the number of ids of each row), since signatures take plain tensors only. It
returns ``{"output": model(inputs)}``. The model must live in one process (every table whole) and
use TensorFlow's own ops: tf_dlrm's CPU kernels are not part of TensorFlow, so build the serving
model in a process started with ``TF_DLRM_DISABLE_KERNELS=1`` (a graph holding one is refused).
"""

from __future__ import annotations

import os
import shutil

import tensorflow as tf


class _Serving(tf.Module):
    def __init__(self, model, input_signature: dict):
        super().__init__(name="tf_dlrm_serving")
        # The variables are tracked, not the Keras model: saving a Keras model object makes TensorFlow
        # trace its call with float inputs made up from its build shapes.
        self.model_variables = [getattr(v, "value", v) for v in model.variables]
        # Dynamic tables: each shard's key -> row map (saved with its contents) and row metadata.
        states = [state for layer in model._flatten_layers(include_self=False) if hasattr(layer, "local_shards")
                  for shard in layer.local_shards for state in layer.states[shard]]
        self.key_maps = [state.map for state in states]
        self.row_metadata = [v for state in states for v in (state.occupied, state.row_key)]
        call = model.__call__
        self.ragged = sorted(name for name, spec in input_signature.items() if isinstance(spec, tf.RaggedTensorSpec))
        flat = []
        for name, spec in input_signature.items():
            if isinstance(spec, tf.RaggedTensorSpec):
                if spec.ragged_rank != 1:
                    raise ValueError(f"Expected ragged input {name!r} of ragged rank 1. Received: {spec}")
                flat += [tf.TensorSpec([None], spec.dtype, name=f"{name}_values"),
                         tf.TensorSpec([None], tf.int64, name=f"{name}_row_lengths")]
            else:
                flat.append(tf.TensorSpec(spec.shape, spec.dtype, name=name))
        self.names = list(input_signature)
        self.flat_names = [spec.name for spec in flat]

        def serve(*tensors):
            inputs, given = {}, dict(zip(self.flat_names, tensors))
            for name in self.names:
                if name in self.ragged:
                    inputs[name] = tf.RaggedTensor.from_row_lengths(given[f"{name}_values"], given[f"{name}_row_lengths"])
                else:
                    inputs[name] = given[name]
            return {"output": call(inputs, training=False)}

        self.serve = tf.function(serve, input_signature=flat)


def export_saved_model(model, path: str, input_signature: dict) -> str:
    """Writes ``model`` (built, in one process) as a SavedModel at ``path`` (which must not exist;
    written beside it first, then renamed); returns ``path``.

    Args:
        model: a built Keras model; its embedding layers must hold every table (one process).
        path: the SavedModel directory.
        input_signature: ``{input name: tf.TensorSpec or tf.RaggedTensorSpec}`` of ``model``'s dict input.

    Raises:
        ValueError: several ranks, an existing ``path``, or a graph using tf_dlrm's own kernels.
    """
    for layer in model._flatten_layers(include_self=False):
        env = getattr(layer, "env", None)
        if env is not None and env.world_size > 1:
            raise ValueError(f"Expected a model in one process (every table whole). Received: layer {layer.name!r} "
                             f"on {env.world_size} ranks: restore its checkpoint into a one-process model first")
    if os.path.exists(path):
        raise ValueError(f"Expected a new SavedModel path. Received: {path!r}, which exists")
    module = _Serving(model, dict(input_signature))
    graph = module.serve.get_concrete_function().graph.as_graph_def()
    used = {node.op for node in graph.node} | {node.op for function in graph.library.function for node in function.node_def}
    custom = sorted(op for op in used if op.startswith("TfDlrm"))
    if custom:
        raise ValueError(f"The serving graph uses tf_dlrm's own kernels {custom}, which plain TensorFlow cannot load: "
                         "build the serving model in a process started with TF_DLRM_DISABLE_KERNELS=1")
    temporary = f"{path.rstrip(os.sep)}.tmp"
    shutil.rmtree(temporary, ignore_errors=True)
    tf.saved_model.save(module, temporary, signatures={"serving_default": module.serve})
    os.rename(temporary, path)
    return path
