"""Export a checkpoint as a TF SavedModel for serving: full tables, MLP weights, one signature.

The SavedModel holds plain ``tf.Variable``s and one traced function, so serving needs TensorFlow
only (``tf.saved_model.load``; no tf_dlrm, no Keras, no Horovod)::

    served = tf.saved_model.load(DIR)
    out = served.signatures["serving_default"](numerical=..., categorical=...)
    out["probability"]  # [batch] click probabilities

Inputs: ``numerical`` float32 ``[batch, num_numerical]`` (the values the training reader yields)
and ``categorical`` int64 ``[batch, num_categorical]`` (ids, columns in feature-spec order). The
forward pass is the one of :class:`tf_dlrm.model.dlrm.DLRM` in float32 with every table whole.
``tf_dlrm_serving.json`` beside it names the features in column order.
"""

from __future__ import annotations

import json
import os

import numpy as np
import tensorflow as tf
from absl import logging as absl_logging

from tf_dlrm.io.publish import check_replaceable, staged_output
from tf_dlrm.model.interaction import lower_triangle_indices
from tf_dlrm.train import checkpoint

SERVING_INFO = "tf_dlrm_serving.json"
WRITER = "tf_dlrm export"


class DLRMServing(tf.Module):
    """DLRM inference over full tables, with plain TF ops.

    Args:
        tables: one ``[rows, dim]`` float32 array per categorical feature.
        bottom: ``(kernel, bias)`` per bottom-MLP layer (all ReLU); empty without numerical features.
        top: ``(kernel, bias)`` per top-MLP layer (ReLU except the last, which gives the logit).
        interaction: ``"dot"`` or ``"cat"``.
        include_diagonal: keep self dot products (``dot`` only).
        num_numerical: width of the numerical input.
    """

    def __init__(self, tables, bottom, top, interaction: str, include_diagonal: bool, num_numerical: int):
        super().__init__(name="dlrm_serving")
        self.tables = [_variable(t, f"table_{i:03d}") for i, t in enumerate(tables)]
        self.bottom_kernels = [tf.Variable(k, trainable=False, name=f"bottom_kernel_{i}") for i, (k, _) in enumerate(bottom)]
        self.bottom_biases = [tf.Variable(b, trainable=False, name=f"bottom_bias_{i}") for i, (_, b) in enumerate(bottom)]
        self.top_kernels = [tf.Variable(k, trainable=False, name=f"top_kernel_{i}") for i, (k, _) in enumerate(top)]
        self.top_biases = [tf.Variable(b, trainable=False, name=f"top_bias_{i}") for i, (_, b) in enumerate(top)]
        self.interaction = interaction
        self.num_vectors = len(tables) + 1
        self.pair_indices = lower_triangle_indices(self.num_vectors, include_diagonal)
        self.serve = tf.function(
            self._serve,
            input_signature=[
                tf.TensorSpec([None, num_numerical], tf.float32, name="numerical"),
                tf.TensorSpec([None, len(tables)], tf.int64, name="categorical"),
            ],
        )

    def _serve(self, numerical, categorical):
        bottom = numerical
        for kernel, bias in zip(self.bottom_kernels, self.bottom_biases):
            bottom = tf.nn.relu(tf.matmul(bottom, kernel) + bias)
        if not self.bottom_kernels:
            bottom = tf.zeros([tf.shape(categorical)[0], 0], tf.float32)
        embeddings = tf.stack([tf.gather(table, categorical[:, t]) for t, table in enumerate(self.tables)], axis=1)
        if self.interaction == "dot":
            vectors = tf.concat([tf.expand_dims(bottom, 1), embeddings], axis=1)
            products = tf.matmul(vectors, vectors, transpose_b=True)
            flat = tf.reshape(products, [-1, self.num_vectors * self.num_vectors])
            features = tf.concat([bottom, tf.gather(flat, self.pair_indices, axis=1)], axis=1)
        else:
            width = embeddings.shape[1] * embeddings.shape[2]
            features = tf.concat([bottom, tf.reshape(embeddings, [-1, width])], axis=1)
        for index, (kernel, bias) in enumerate(zip(self.top_kernels, self.top_biases)):
            features = tf.matmul(features, kernel) + bias
            if index < len(self.top_kernels) - 1:
                features = tf.nn.relu(features)
        return {"probability": tf.reshape(tf.sigmoid(features), [-1])}


def _variable(values, name: str) -> tf.Variable:
    return values if isinstance(values, tf.Variable) else tf.Variable(values, trainable=False, name=name)


def _mlp(directory: str, manifest: dict, name: str, depth: int) -> list[tuple[np.ndarray, np.ndarray]]:
    files = {entry["name"]: entry["file"] for entry in manifest["dense"]}
    sizes = {file: entry.get("shape") for file, entry in manifest["files"].items()}
    layers = []
    for index in range(depth):
        pair = []
        for part in ("kernel", "bias"):
            key = f"{name}/dense_{index}/{part}"
            if key not in files:
                raise checkpoint.CheckpointError(f"checkpoint {directory}: no weight {key} in its manifest")
            pair.append(checkpoint.load_array(directory, files[key], sizes[files[key]], np.float32))
        layers.append(tuple(pair))
    return layers


def export_checkpoint(directory: str, manifest: dict, saved_model_path: str) -> dict:
    """Writes the SavedModel of a verified checkpoint atomically; returns a summary.

    Loads one table at a time into its variable (the process holds the full model once, as the
    SavedModel does). Refuses to overwrite a non-empty ``saved_model_path`` (a SavedModel is never
    replaced) or to write around the checkpoint it reads; staged and published by
    :func:`tf_dlrm.io.publish.staged_output`.
    """
    if os.path.exists(saved_model_path) and (not os.path.isdir(saved_model_path) or os.listdir(saved_model_path)):
        raise ValueError(f"--saved_model_path={saved_model_path} exists and is not empty; choose a new directory")
    check_replaceable(os.path.abspath(saved_model_path), "--saved_model_path", WRITER, [directory])
    model = manifest["model"]
    tables = []
    for index, (entry, rows) in enumerate(zip(manifest["tables"], model["cardinalities"])):
        values = checkpoint.load_array(directory, entry["file"], (rows, model["embedding_dim"]), np.float32)
        tables.append(_variable(values, f"table_{index:03d}"))
        del values
    bottom = _mlp(directory, manifest, "bottom_mlp", len(model["bottom_mlp_dims"]) if model["num_numerical"] else 0)
    top = _mlp(directory, manifest, "top_mlp", len(model["top_mlp_dims"]))
    module = DLRMServing(tables, bottom, top, model["interaction"], model["include_diagonal"], model["num_numerical"])
    del tables
    with staged_output(saved_model_path, "--saved_model_path", WRITER, [directory]) as temporary:
        _save(module, temporary, _serving_info(directory, manifest))
    return _serving_info(directory, manifest)


def _save(module, temporary: str, info: dict) -> None:
    verbosity = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.WARNING)  # TensorFlow logs every file it writes at INFO
    try:
        tf.saved_model.save(module, temporary, signatures={"serving_default": module.serve})
    finally:
        absl_logging.set_verbosity(verbosity)
    with open(os.path.join(temporary, SERVING_INFO), "w", encoding="utf-8") as handle:
        json.dump(info, handle, indent=1)


def _serving_info(directory: str, manifest: dict) -> dict:
    model = manifest["model"]
    return {
        "signature": "serving_default",
        "inputs": {
            "numerical": {"dtype": "float32", "shape": [None, model["num_numerical"]]},
            "categorical": {"dtype": "int64", "shape": [None, len(model["cardinalities"])], "columns": model["categorical_features"]},
        },
        "outputs": {"probability": {"dtype": "float32", "shape": [None]}},
        "cardinalities": model["cardinalities"],
        "checkpoint": os.path.abspath(directory),
        "step": manifest["step"],
    }
