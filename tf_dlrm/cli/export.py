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
and ``categorical`` int64 ``[batch, num_one_hot]`` (one id per one-hot feature, columns in
feature-spec order). Each multi-hot feature has inputs of its own, named after the feature
(:func:`tf_dlrm.embedding.serving.input_name`: ``cat_1.bin`` serves as ``cat_1_bin``): a fixed one
(``hotness`` ids per sample) int64 ``[batch, hotness]``; a ragged one (``ragged: true``, 0 to
``hotness`` ids) ``cat_1_bin_values`` (the ids of every sample, concatenated) and
``cat_1_bin_row_lengths`` (ids per sample), both int64 ``[n]``, as
:func:`tf_dlrm.embedding.serving.export_saved_model` names ragged inputs. ``tf_dlrm_serving.json``
beside it lists every input with its features. A batch of another width, inputs of different batch
sizes, row lengths that do not sum to the values or exceed ``hotness``, or an id outside its
feature's ``[0, cardinality)`` stop the call with ``InvalidArgumentError: assertion failed: [...]``
naming the input, the expected shape and what was received, rather than scoring (signatures check
dtypes, not shapes: a 9th column would otherwise be dropped in silence).
"""

from __future__ import annotations

import json

import keras
import numpy as np
import tensorflow as tf
from absl import logging as absl_logging

from tf_dlrm.parallel.env import DistributedEnv
from tf_dlrm.io import files
from tf_dlrm.io.publish import check_replaceable, staged_output
from tf_dlrm.embedding.serving import (checked_batch, checked_inputs, checked_multi_hot, flat_signature, input_name,
                                      own_kernels, ragged_input)
from tf_dlrm.embedding.variable_kind import VariableKind, variables_of_kind
from tf_dlrm.checkpoint import store as checkpoint_store
from tf_dlrm.ops import kernels_off
from tf_dlrm.checkpoint import checkpointer as checkpoint, dynamic_tables as checkpoint_dynamic
from tf_dlrm.checkpoint.slices import open_slices, restore_pieces

SERVING_INFO = "tf_dlrm_serving.json"
WRITER = "tf_dlrm export"


class ServingModule(tf.Module):
    """A built model (one-process plan) behind one signature: ``(numerical, categorical, multi-hot...) -> probability``.

    Args:
        model: a built tf_dlrm model whose embedding holds every table whole.
        numerical_features: the numerical input's columns (spec order).
        categorical_features: every categorical feature (spec order): the one-hot ones are the
            ``categorical`` input's columns, each multi-hot one has inputs of its own
            (:func:`multi_hot_inputs`).
        cardinalities: rows of each categorical feature's table; a served id outside its
            ``[0, cardinality)`` is refused (:func:`tf_dlrm.embedding.serving.checked_batch`,
            :func:`~tf_dlrm.embedding.serving.checked_multi_hot`), as are widths, batch sizes and
            row lengths that do not match.
        hotness: ids per sample of each categorical feature (default all 1: one-hot).
        ragged: whether each feature's samples hold 0 to ``hotness`` ids (default none).
    """

    def __init__(self, model, numerical_features, categorical_features, cardinalities, hotness=None, ragged=None):
        super().__init__(name="tf_dlrm_serving")
        self.model = model
        self.numerical_features, self.features = list(numerical_features), list(categorical_features)
        self.hotness = [int(h) for h in hotness or [1] * len(self.features)]
        self.ragged = [bool(r) for r in ragged or [False] * len(self.features)]
        self.all_cardinalities = [int(c) for c in cardinalities]
        self.one_hot = [i for i in range(len(self.features)) if self.hotness[i] == 1 and not self.ragged[i]]
        self.categorical_features = [self.features[i] for i in self.one_hot]
        self.cardinalities = [self.all_cardinalities[i] for i in self.one_hot]
        self.multi_hot = multi_hot_inputs(self.features, self.hotness, self.ragged)
        taken = {"numerical", "categorical"}
        for name in self.multi_hot:
            flat = {spec.name for spec in flat_signature({name: self.multi_hot[name]})}
            if flat & taken:
                raise ValueError(f"Expected serving input names of their own. Received: feature {name!r} serves as "
                                 f"{sorted(flat)}, already taken by another input")
            taken |= flat
        self.serve = tf.function(
            self._serve,
            input_signature=[
                tf.TensorSpec([None, len(self.numerical_features)], tf.float32, name="numerical"),
                tf.TensorSpec([None, len(self.categorical_features)], tf.int64, name="categorical"),
                *flat_signature(self.multi_hot),
            ],
        )

    def _serve(self, numerical, categorical, *multi_hot):
        numerical, categorical = checked_batch(numerical, categorical, self.numerical_features, self.categorical_features,
                                               self.cardinalities)
        given, inputs = dict(zip([spec.name for spec in flat_signature(self.multi_hot)], multi_hot)), {}
        for name, spec in self.multi_hot.items():
            inputs[name] = (ragged_input(name, given[f"{name}_values"], given[f"{name}_row_lengths"])
                            if isinstance(spec, tf.RaggedTensorSpec) else given[name])
        # One batch size across all inputs (and the fixed widths): the one-hot ones were checked above.
        inputs = checked_inputs({"numerical": numerical, **inputs},
                                {"numerical": tf.TensorSpec([None, len(self.numerical_features)]), **self.multi_hot})
        columns, one_hot = [], iter(range(len(self.one_hot)))
        for index, feature in enumerate(self.features):
            if index in self.one_hot:
                columns.append(categorical[:, next(one_hot)])
            else:
                name = input_name(feature)
                columns.append(checked_multi_hot(name, feature, inputs[name], self.hotness[index],
                                                 self.all_cardinalities[index]))
        logits = self.model({"numerical": inputs["numerical"], **dict(zip(self.features, columns))}, training=False)
        return {"probability": tf.reshape(tf.sigmoid(tf.cast(logits, tf.float32)), [-1])}

    def inputs_info(self) -> dict:
        """The signature's inputs as ``tf_dlrm_serving.json`` describes them."""
        info = {
            "numerical": {"dtype": "float32", "shape": [None, len(self.numerical_features)], "columns": self.numerical_features},
            "categorical": {"dtype": "int64", "shape": [None, len(self.categorical_features)], "columns": self.categorical_features,
                            "cardinalities": self.cardinalities},
        }
        for index, feature in enumerate(self.features):
            if index in self.one_hot:
                continue
            name = input_name(feature)
            what = {"feature": feature, "hotness": self.hotness[index], "cardinality": self.all_cardinalities[index]}
            if self.ragged[index]:
                info[f"{name}_values"] = {"dtype": "int64", "shape": [None], **what}
                info[f"{name}_row_lengths"] = {"dtype": "int64", "shape": [None], **what}
            else:
                info[name] = {"dtype": "int64", "shape": [None, self.hotness[index]], **what}
        return info


def multi_hot_inputs(features: list, hotness: list, ragged: list) -> dict:
    """``{input name: tf.TensorSpec or tf.RaggedTensorSpec}`` of the multi-hot features: a fixed one
    (exactly ``hotness`` ids per sample) is int64 ``[batch, hotness]``, a ragged one (0 to ``hotness``)
    int64 ``[batch, None]``, served as ``<name>_values`` and ``<name>_row_lengths``; names by
    :func:`tf_dlrm.embedding.serving.input_name`."""
    inputs = {}
    for feature, ids, variable in zip(features, hotness, ragged):
        if ids == 1 and not variable:
            continue
        name = input_name(feature)
        if name in inputs:
            raise ValueError(f"Expected serving input names of their own. Received: features {feature!r} and another "
                             f"both serve as {name!r}")
        inputs[name] = (tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1) if variable
                        else tf.TensorSpec([None, ids], tf.int64))
    return inputs


def rebuild_for_serving(spec, model_config, seed: int = 0):
    """The model of ``model_config`` on one process (every table whole), float32, built."""
    from tf_dlrm.cli import builder
    from tf_dlrm.cli.model_config import ShardingConfig

    keras.mixed_precision.set_global_policy("float32")  # served in float32 whatever the training precision
    plan = builder.make_sharding_plan(spec, model_config, ShardingConfig(strategy="table_wise"), 1)
    # Built with TensorFlow's ops only: the embedding layer picks its pooling path (tf_dlrm's bag kernel
    # for multi-hot features when loaded) as it is built, and the SavedModel must not hold that kernel.
    with kernels_off():
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
    if files.exists(saved_model_path) and (not files.isdir(saved_model_path) or files.listdir(saved_model_path)):
        raise ValueError(f"--saved_model_path={saved_model_path} exists and is not empty; choose a new directory")
    check_replaceable(files.absolute(saved_model_path), "--saved_model_path", WRITER, [directory])
    from tf_dlrm.cli import dynamic_builder

    if dynamic_builder.has_dynamic_tables(spec) or manifest.get(checkpoint_dynamic.MANIFEST_KEY):
        module = dynamic_serving(directory, manifest, spec, model_config)
    else:
        model = rebuild_for_serving(spec, model_config)
        load_checkpoint_into(model, directory, manifest)
        module = ServingModule(model, spec.numerical_features, spec.categorical_features, spec.cardinalities(),
                               [spec.hotness(name) for name in spec.categorical_features],
                               [spec.ragged(name) for name in spec.categorical_features])
    info = _serving_info(directory, manifest, module.inputs_info() if isinstance(module, ServingModule) else None)
    with staged_output(saved_model_path, "--saved_model_path", WRITER, [directory]) as temporary:
        _save(module, temporary, info)
    return info


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
            custom = own_kernels(module.serve)
            if custom:  # a model layer that chose a kernel as it was built, before kernels_off
                raise ValueError(f"Expected a serving graph of TensorFlow's ops only. Received: tf_dlrm's kernels {custom}, "
                                 "which plain TensorFlow cannot load")
            tf.saved_model.save(module, temporary, signatures={"serving_default": module.serve})
    finally:
        absl_logging.set_verbosity(verbosity)
    with files.open_file(files.join(temporary, SERVING_INFO), "w", encoding="utf-8") as handle:
        json.dump(info, handle, indent=1)


def _serving_info(directory: str, manifest: dict, inputs: dict | None = None) -> dict:
    model = manifest["model"]
    return {
        "signature": "serving_default",
        "model": model["name"],
        "inputs": inputs or {
            "numerical": {"dtype": "float32", "shape": [None, model["num_numerical"]]},
            "categorical": {"dtype": "int64", "shape": [None, len(model["cardinalities"])], "columns": model["categorical_features"]},
        },
        "outputs": {"probability": {"dtype": "float32", "shape": [None]}},
        "cardinalities": model["cardinalities"],
        "checkpoint": files.absolute(directory),
        "step": manifest["step"],
    }
