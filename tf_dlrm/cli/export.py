"""Export a checkpoint as a TF SavedModel for serving: the trained Keras model itself, tables whole.

The model of the flags (any ``--model``: tf_dlrm's, or a library model ``package.module:Name``; fixed or
dynamic tables) is rebuilt in **one process** (every table whole and local), the checkpoint's tables and
dense weights are loaded into it, and its own forward pass is traced into the one serving signature of
:mod:`tf_dlrm.embedding.serving`. No model needs export code of its own, and the SavedModel holds plain
variables and TensorFlow ops (and, for dynamic tables, their key maps), so serving needs TensorFlow only
(``tf.saved_model.load``; no tf_dlrm, no Keras, no Horovod)::

    served = tf.saved_model.load(DIR)
    out = served.signatures["serving_default"](numerical=..., cat_0_bin=..., cat_1_bin_values=...,
                                               cat_1_bin_row_lengths=..., ...)
    out["probability"]  # [batch] click probabilities, calibrated as --mode=eval's (the checkpoint's calibration)

Inputs (:func:`serving_signature`, from the FeatureSpec): ``numerical`` float32 ``[batch, num_numerical]``
(the values the training reader yields) and one input per categorical feature the model reads, named
:func:`tf_dlrm.embedding.serving.input_name` of it (``cat_1.bin`` serves as ``cat_1_bin``): a one-hot
feature int64 ``[batch]`` (a dynamic table's raw keys too), a fixed multi-hot one (``hotness`` ids per
sample) int64 ``[batch, hotness]``, a ragged one (``ragged: true``, 0 to ``hotness`` ids) as
``<name>_values`` (the ids of every sample, concatenated) and ``<name>_row_lengths`` (ids per sample), a
weighted one (``weighted: true``) followed by its weights, ``<name>_weights_values`` (float32) and
``<name>_weights_row_lengths``. ``tf_dlrm_serving.json`` beside it lists every input with its dtype, shape and feature. A batch of another
width, inputs of different batch sizes or row lengths that do not sum to the values stop the call with
``InvalidArgumentError: assertion failed: [...]`` naming the input; an id outside its table or a row
longer than its feature's hotness is refused by the embedding layer, naming the feature.
"""

from __future__ import annotations

import json

import keras
import numpy as np
import tensorflow as tf
from absl import logging as absl_logging

from tf_dlrm.calibration import Calibration
from tf_dlrm.parallel.env import DistributedEnv
from tf_dlrm.io import files
from tf_dlrm.io.publish import check_replaceable, staged_output
from tf_dlrm.embedding.serving import save_module, serving_module, variable_map
from tf_dlrm.embedding.training_step import embedding_layer
from tf_dlrm.embedding.variable_kind import VariableKind, variables_of_kind
from tf_dlrm.checkpoint import store as checkpoint_store
from tf_dlrm.checkpoint import checkpointer as checkpoint, dynamic_tables as checkpoint_dynamic
from tf_dlrm.checkpoint.checks import check_names
from tf_dlrm.checkpoint.slices import open_slices, restore_pieces
from tf_dlrm.spec.format import NUMERICAL_CHANNEL

SERVING_INFO = "tf_dlrm_serving.json"
WRITER = "tf_dlrm export"


def serving_signature(spec, input_names) -> dict:
    """``{model input name: tf.TensorSpec or tf.RaggedTensorSpec}`` of a model reading ``input_names``
    (its ``input_modes``' keys) of ``spec``: ``numerical`` float32 ``[None, num_numerical]``, then each
    categorical feature read, in spec order: one-hot int64 ``[None]``, fixed multi-hot int64 ``[None,
    hotness]``, ragged ``tf.RaggedTensorSpec([None, None], tf.int64, 1)`` (a weighted one followed by
    ``<feature>_weights``, float32 and ragged alike)."""
    read = set(input_names)
    signature = {NUMERICAL_CHANNEL: tf.TensorSpec([None, len(spec.numerical_features)], tf.float32)}
    for feature in spec.categorical_features:
        if feature not in read:
            continue
        if spec.ragged(feature):
            signature[feature] = tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1)
            if spec.weighted(feature):  # its weights beside it, ragged like its ids
                signature[f"{feature}_weights"] = tf.RaggedTensorSpec([None, None], tf.float32, ragged_rank=1)
        elif spec.hotness(feature) > 1:
            signature[feature] = tf.TensorSpec([None, spec.hotness(feature)], tf.int64)
        else:
            signature[feature] = tf.TensorSpec([None], tf.int64)
    return signature


def model_signature(spec, model) -> dict:
    """:func:`serving_signature` of the features ``model`` reads."""
    return serving_signature(spec, model.input_modes)


def rebuild_for_serving(spec, model_config, seed: int = 0, num_shards: int | None = None):
    """The model of ``model_config`` on one process (every table whole), float32, built; ``num_shards``: a
    dynamic table's shards (a checkpoint's count, so the same capacity per shard)."""
    from tf_dlrm.cli import builder
    from tf_dlrm.cli.model_config import ShardingConfig

    keras.mixed_precision.set_global_policy("float32")  # served in float32 whatever the training precision
    env = DistributedEnv(rank=0, world_size=1)
    if builder.registry.is_library_model(builder.model_class(model_config)):
        return builder.build_library_model(spec, model_config, env, seed)
    plan = builder.make_sharding_plan(spec, model_config, ShardingConfig(strategy="table_wise"), 1)
    # The embedding layer picks its kernel paths as the signature is traced (inside kernels_off), not here.
    return builder.build_model(spec, plan, model_config, env, seed, serving=True, num_shards=num_shards)


def load_checkpoint_into(model, directory: str, manifest: dict, by_name: bool = True) -> None:
    """Tables (in plan order), dynamic tables' rows and dense weights of a verified checkpoint into
    ``model`` (one process).

    Tables stream in chunks of rows from their saved slices (:mod:`tf_dlrm.checkpoint.slices`): the
    process holds each table once, in the model, never a second full copy beside it. Dynamic tables'
    rows are re-routed to this process's shards. ``by_name``: dense weights matched by name (two
    ``main.py`` runs of one of tf_dlrm's models); else by order, each shape checked (a library model's
    unnamed layers are numbered per process, see :func:`tf_dlrm.checkpoint.checks.check_names`)."""
    layer = embedding_layer(model)
    tables = [] if layer.plan is None else list(layer.plan.tables)
    if len(manifest["tables"]) != len(tables):
        raise checkpoint_store.CheckpointError(f"checkpoint {directory}: {len(manifest['tables'])} tables, the model has {len(tables)}")
    for index, (entry, table) in enumerate(zip(manifest["tables"], tables)):
        if entry.get("name") != table.name:
            raise checkpoint_store.CheckpointError(f"checkpoint {directory}: table {index} is {entry.get('name')!r}, the model's is {table.name!r}")
    checkpoint_dynamic.check(directory, manifest, layer, None)
    dense = [(checkpoint._relative(v.path), v) for v in variables_of_kind(model.trainable_variables, VariableKind.DENSE)]
    check_names(directory, "dense weights", manifest["dense"], dense, by_name)
    # Every dense array read (and its shape checked) before any weight changes: a refusal leaves the model as it was.
    arrays = [checkpoint_store.load_array(directory, entry["file"], variable.shape, np.float32)
              for entry, (_, variable) in zip(manifest["dense"], dense)]
    for index, (entry, table) in enumerate(zip(manifest["tables"], tables)):
        restore_pieces(layer, index, open_slices(directory, entry, table.rows, table.dim))
    if checkpoint_dynamic.is_dynamic(layer):
        checkpoint_dynamic.restore_rows(checkpoint_dynamic.folder_of(directory, manifest), layer.dynamic_layer, None,
                                        layer.env)
    for array, (_, variable) in zip(arrays, dense):
        variable.assign(array)


def export_checkpoint(directory: str, manifest: dict, saved_model_path: str, spec, model_config,
                      calibrated: bool = True) -> dict:
    """Writes the SavedModel of a verified checkpoint atomically; returns a summary.

    ``calibrated``: the served probabilities apply the calibration the manifest holds, if any (as ``--mode=eval``
    does; ``--calibration=none``: the model's own).

    The process holds the full model once, as the SavedModel does. Refuses to overwrite a non-empty
    ``saved_model_path`` (a SavedModel is never replaced) or to write around the checkpoint it
    reads; staged and published by :func:`tf_dlrm.io.publish.staged_output`.
    """
    from tf_dlrm.cli import builder

    if files.exists(saved_model_path) and (not files.isdir(saved_model_path) or files.listdir(saved_model_path)):
        raise ValueError(f"--saved_model_path={saved_model_path} exists and is not empty; choose a new directory")
    check_replaceable(files.absolute(saved_model_path), "--saved_model_path", WRITER, [directory])
    library = builder.registry.is_library_model(builder.model_class(model_config))
    num_shards = seed = None
    if manifest.get(checkpoint_dynamic.MANIFEST_KEY) and not library:
        # tf_dlrm's dynamic tables: the checkpoint's shard count and seed (a new key's row depends on it).
        meta = checkpoint_dynamic.read_meta(checkpoint_dynamic.folder_of(directory, manifest))
        num_shards, seed = meta["num_shards"], meta["seed"]
    model = rebuild_for_serving(spec, model_config, seed or 0, num_shards)
    load_checkpoint_into(model, directory, manifest, by_name=not library)
    calibration = Calibration.from_record(manifest.get("calibration")) if calibrated else None
    module = serving_module(model, model_signature(spec, model), calibration)
    info = serving_info(spec, module, builder.model_identity(model_config)["name"], directory, manifest["step"])
    info["calibration"] = None if calibration is None else manifest["calibration"]
    try:
        info["variables"] = variable_map(model, module)  # where tf_dlrm.cli.apply_deltas writes a delta's rows
    except (KeyError, ValueError):
        info["variables"] = None  # a weight the SavedModel does not track as itself: apply_deltas refuses this export
    with staged_output(saved_model_path, "--saved_model_path", WRITER, [directory]) as temporary:
        _save(module, temporary, info)
    return info


def check_kind(directory: str, manifest: dict, spec) -> None:
    """Refuses a checkpoint of fixed tables for a spec of dynamic ones, and the reverse."""
    from tf_dlrm.cli import dynamic_builder

    checkpoint_dynamic.check_kind(directory, manifest, dynamic_builder.has_dynamic_tables(spec))


def serving_info(spec, module, model: str, directory: str | None = None, step: int | None = None) -> dict:
    """What ``tf_dlrm_serving.json`` says: the signature, the model, every input (its dtype, shape, and the
    features it carries: the numerical ones, or one categorical feature with its hotness, whether ragged
    and its table's rows, None for a dynamic table) and the output; the checkpoint and its step."""
    from tf_dlrm.spec.dynamic import dynamic_features

    inputs, dynamic = module.inputs_info(), set(dynamic_features(spec))
    for entry in inputs.values():
        name = entry.pop("input")
        if name == NUMERICAL_CHANNEL:
            entry["features"] = list(spec.numerical_features)
            continue
        if name not in spec.feature_spec and name.endswith("_weights"):  # a weighted feature's weights
            entry["weights_of"] = name[:-len("_weights")]
            continue
        entry.update(feature=name, hotness=spec.hotness(name), ragged=spec.ragged(name),
                     cardinality=None if name in dynamic else spec.feature_spec[name].get("cardinality"))
    return {
        "signature": "serving_default",
        "model": model,
        "inputs": inputs,
        "outputs": {"probability": {"dtype": "float32", "shape": [None]}},
        "checkpoint": None if directory is None else files.absolute(directory),
        "step": step,
    }


def _save(module, temporary: str, info: dict) -> None:
    verbosity = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.WARNING)  # TensorFlow logs every file it writes at INFO
    try:
        save_module(module, temporary)
    finally:
        absl_logging.set_verbosity(verbosity)
    with files.open_file(files.join(temporary, SERVING_INFO), "w", encoding="utf-8") as handle:
        json.dump(info, handle, indent=1)
