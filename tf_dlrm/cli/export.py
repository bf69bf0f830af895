"""Export a checkpoint as a TF SavedModel for serving: the trained Keras model itself, tables whole.

The model of the flags (any ``--model``) is rebuilt on a **one-process plan** (every table whole
and local), the checkpoint's full tables and dense weights are loaded into it, and the model's own
forward pass is traced into one serving signature. No model needs export code of its own, and the
SavedModel holds plain variables and TensorFlow ops, so serving needs TensorFlow only
(``tf.saved_model.load``; no tf_dlrm, no Keras, no Horovod)::

    served = tf.saved_model.load(DIR)
    out = served.signatures["serving_default"](numerical=..., categorical=...)
    out["probability"]  # [batch] click probabilities

Inputs: ``numerical`` float32 ``[batch, num_numerical]`` (the values the training reader yields)
and ``categorical`` int64 ``[batch, num_categorical]`` (one id per one-hot feature, columns in
feature-spec order). ``tf_dlrm_serving.json`` beside it names the features in column order. A batch
of another width, numerical and categorical batches of different sizes, or an id outside its
feature's ``[0, cardinality)`` stop the call with ``InvalidArgumentError: assertion failed: [...]``
naming the input, the expected shape and what was received, rather than scoring (signatures check
dtypes, not shapes: a 9th column would otherwise be dropped in silence).
"""

from __future__ import annotations

import json
import os

import keras
import numpy as np
import tensorflow as tf
from absl import logging as absl_logging

from tf_dlrm.parallel.env import DistributedEnv
from tf_dlrm.io.publish import check_replaceable, staged_output
from tf_dlrm.embedding.serving import checked_batch
from tf_dlrm.embedding.variable_kind import VariableKind, variables_of_kind
from tf_dlrm.checkpoint import store as checkpoint_store
from tf_dlrm.ops import kernels_off
from tf_dlrm.checkpoint import checkpointer as checkpoint, dynamic_tables as checkpoint_dynamic
from tf_dlrm.checkpoint.slices import open_slices, restore_pieces

SERVING_INFO = "tf_dlrm_serving.json"
WRITER = "tf_dlrm export"


class ServingModule(tf.Module):
    """A built model (one-process plan) behind one signature: ``(numerical, categorical) -> probability``.

    Args:
        model: a built tf_dlrm model whose embedding holds every table whole.
        numerical_features: the numerical input's columns (spec order).
        categorical_features: the categorical input's columns (one-hot features, spec order).
        cardinalities: rows of each categorical feature's table; a served id outside its
            ``[0, cardinality)`` is refused (:func:`tf_dlrm.embedding.serving.checked_batch`), as
            are widths and batch sizes that do not match.
    """

    def __init__(self, model, numerical_features, categorical_features, cardinalities):
        super().__init__(name="tf_dlrm_serving")
        self.model = model
        self.numerical_features, self.categorical_features = list(numerical_features), list(categorical_features)
        self.cardinalities = [int(c) for c in cardinalities]
        self.serve = tf.function(
            self._serve,
            input_signature=[
                tf.TensorSpec([None, len(self.numerical_features)], tf.float32, name="numerical"),
                tf.TensorSpec([None, len(self.categorical_features)], tf.int64, name="categorical"),
            ],
        )

    def _serve(self, numerical, categorical):
        numerical, categorical = checked_batch(numerical, categorical, self.numerical_features, self.categorical_features,
                                               self.cardinalities)
        columns = tuple(categorical[:, column] for column in range(len(self.categorical_features)))
        logits = self.model((numerical, columns), training=False)
        return {"probability": tf.reshape(tf.sigmoid(tf.cast(logits, tf.float32)), [-1])}


def rebuild_for_serving(spec, model_config, seed: int = 0):
    """The model of ``model_config`` on one process (every table whole), float32, built."""
    from tf_dlrm.cli import builder
    from tf_dlrm.cli.model_config import ShardingConfig

    multi_hot = [name for name in spec.categorical_features if spec.hotness(name) != 1]
    if multi_hot:
        raise ValueError(f"export serves one id per categorical feature; these features are multi-hot: {multi_hot}")
    keras.mixed_precision.set_global_policy("float32")  # served in float32 whatever the training precision
    plan = builder.make_sharding_plan(spec, model_config, ShardingConfig(strategy="table_wise"), 1)
    return builder.build_model(spec, plan, model_config, DistributedEnv(rank=0, world_size=1), seed, serving=True)


def load_checkpoint_into(model, directory: str, manifest: dict) -> None:
    """Tables (in plan order) and dense weights (by name) of a verified checkpoint into ``model``.

    Tables stream in chunks of rows from their saved slices (:mod:`tf_dlrm.checkpoint.slices`):
    the process holds each table once, in the model, never a second full copy beside it."""
    tables = model.embedding.plan.tables
    if len(manifest["tables"]) != len(tables):
        raise checkpoint_store.CheckpointError(f"checkpoint {directory}: {len(manifest['tables'])} tables, the model has {len(tables)}")
    for index, (entry, table) in enumerate(zip(manifest["tables"], tables)):
        if entry.get("name") != table.name:
            raise checkpoint_store.CheckpointError(f"checkpoint {directory}: table {index} is {entry.get('name')!r}, the model's is {table.name!r}")
        restore_pieces(model.embedding, index, open_slices(directory, entry, table.rows, table.dim))
    load_dense_into(model, directory, manifest)


def load_dense_into(model, directory: str, manifest: dict) -> None:
    """The dense weights (by name) of a verified checkpoint into ``model``."""
    files = {entry["name"]: entry["file"] for entry in manifest["dense"]}
    for variable in variables_of_kind(model.trainable_variables, VariableKind.DENSE):
        name = checkpoint._relative(variable.path)
        if name not in files:
            raise checkpoint_store.CheckpointError(f"checkpoint {directory}: no weight {name} in its manifest")
        variable.assign(checkpoint_store.load_array(directory, files[name], variable.shape, np.float32))


def export_checkpoint(directory: str, manifest: dict, saved_model_path: str, spec, model_config) -> dict:
    """Writes the SavedModel of a verified checkpoint atomically; returns a summary.

    The process holds the full model once, as the SavedModel does. Refuses to overwrite a non-empty
    ``saved_model_path`` (a SavedModel is never replaced) or to write around the checkpoint it
    reads; staged and published by :func:`tf_dlrm.io.publish.staged_output`.
    """
    if os.path.exists(saved_model_path) and (not os.path.isdir(saved_model_path) or os.listdir(saved_model_path)):
        raise ValueError(f"--saved_model_path={saved_model_path} exists and is not empty; choose a new directory")
    check_replaceable(os.path.abspath(saved_model_path), "--saved_model_path", WRITER, [directory])
    from tf_dlrm.cli import dynamic_builder

    if dynamic_builder.has_dynamic_tables(spec) or manifest.get(checkpoint_dynamic.MANIFEST_KEY):
        module = dynamic_serving(directory, manifest, spec, model_config)
    else:
        model = rebuild_for_serving(spec, model_config)
        load_checkpoint_into(model, directory, manifest)
        module = ServingModule(model, spec.numerical_features, spec.categorical_features, spec.cardinalities())
    with staged_output(saved_model_path, "--saved_model_path", WRITER, [directory]) as temporary:
        _save(module, temporary, _serving_info(directory, manifest))
    return _serving_info(directory, manifest)


def check_kind(directory: str, manifest: dict, spec) -> None:
    """Refuses a checkpoint of fixed tables for a spec of dynamic ones, and the reverse."""
    from tf_dlrm.cli import dynamic_builder

    checkpoint_dynamic.check_kind(directory, manifest, dynamic_builder.has_dynamic_tables(spec))


def dynamic_serving(directory: str, manifest: dict, spec, model_config):
    """The serving module of a checkpoint of dynamic tables (:mod:`tf_dlrm.embedding.dynamic.export`): one
    process holds the checkpoint's shards (same count, so the same capacity per shard), every key
    re-routed to its shard with its row; the SavedModel carries the key maps and takes raw keys."""
    from tf_dlrm.cli import dynamic_builder
    from tf_dlrm.embedding.dynamic.export import DynamicServing
    from tf_dlrm.cli import builder

    checkpoint_dynamic.check_kind(directory, manifest, dynamic_builder.has_dynamic_tables(spec))
    folder = checkpoint_dynamic.folder_of(directory, manifest)
    meta = checkpoint_dynamic.read_meta(folder)
    keras.mixed_precision.set_global_policy("float32")  # served in float32 whatever the training precision
    env = DistributedEnv(rank=0, world_size=1)
    model = builder.build_model(spec, None, model_config, env, meta["seed"], serving=True, num_shards=meta["num_shards"])
    checkpoint_dynamic.check(directory, manifest, model.embedding, None)
    load_dense_into(model, directory, manifest)
    checkpoint_dynamic.restore_rows(folder, model.embedding.dynamic_layer, None, env)
    return DynamicServing(model, spec.numerical_features, spec.categorical_features)


def _save(module, temporary: str, info: dict) -> None:
    verbosity = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.WARNING)  # TensorFlow logs every file it writes at INFO
    try:
        # tf_dlrm's own CPU kernels are not part of TensorFlow: the signature is traced with TensorFlow's ops.
        with kernels_off():
            tf.saved_model.save(module, temporary, signatures={"serving_default": module.serve})
    finally:
        absl_logging.set_verbosity(verbosity)
    with open(os.path.join(temporary, SERVING_INFO), "w", encoding="utf-8") as handle:
        json.dump(info, handle, indent=1)


def _serving_info(directory: str, manifest: dict) -> dict:
    model = manifest["model"]
    return {
        "signature": "serving_default",
        "model": model["name"],
        "inputs": {
            "numerical": {"dtype": "float32", "shape": [None, model["num_numerical"]]},
            "categorical": {"dtype": "int64", "shape": [None, len(model["cardinalities"])], "columns": model["categorical_features"]},
        },
        "outputs": {"probability": {"dtype": "float32", "shape": [None]}},
        "cardinalities": model["cardinalities"],
        "checkpoint": os.path.abspath(directory),
        "step": manifest["step"],
    }
