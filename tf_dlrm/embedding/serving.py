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

A signature checks dtypes but not shapes: a ``[batch, 9]`` tensor binds to a ``[None, 8]`` input
and its extra column would be dropped in silence. So the served function asserts, inside the
graph (a plain ``tf.saved_model.load`` user gets the message), every known width, one batch size
across its inputs, and ``sum(row_lengths) == size(values)`` of a ragged input
(:func:`checked_inputs`; :func:`checked_batch` for the ``(numerical, categorical)`` signature of
``--mode=export``, :func:`checked_multi_hot` for its multi-hot inputs).
"""

from __future__ import annotations

import os
import re
import shutil

import tensorflow as tf

from tf_dlrm.embedding.sublayers import sublayers


def _shape_check(name: str, tensor, expected: tf.TensorShape, what: str):
    """``(assert, batch size)`` of one serving input: every known dimension past the batch axis, and the rank.

    The rank cannot be read from the graph: a signature input's static shape is the signature's, so
    TensorFlow folds ``tf.rank`` to it whatever is fed. The runtime shape is read instead, padded with
    zeros (a missing axis reads 0), and when every dimension past the batch axis is known the element
    count must be ``batch * width`` (an extra axis changes it)."""
    shape = tf.shape(tensor, out_type=tf.int64)
    padded = tf.concat([shape, tf.zeros([max(expected.rank, 1)], tf.int64)], axis=0)
    conditions = [tf.equal(padded[axis], expected[axis]) for axis in range(1, expected.rank) if expected[axis] is not None]
    if expected.rank >= 1 and expected[1:].is_fully_defined():
        conditions.append(tf.equal(tf.size(tensor, out_type=tf.int64), padded[0] * expected[1:].num_elements()))
    layout = "[" + ", ".join(["batch"] + ["?" if d is None else str(d) for d in expected.as_list()[1:]]) + "]"
    check = tf.debugging.Assert(tf.reduce_all(tf.stack(conditions)) if conditions else True,
                                [f"serving input {name!r}: expected shape {layout} ({what}). Received shape:", shape])
    return check, padded[0]


def _batch_asserts(sizes: dict) -> list:
    """Every input holds the same number of samples as the first."""
    names = list(sizes)
    return [tf.debugging.Assert(tf.equal(sizes[name], sizes[names[0]]),
                                [f"serving inputs {names[0]!r} and {name!r} must hold the same number of samples (one "
                                 f"row each). Received: {names[0]!r}", sizes[names[0]], f"rows, {name!r}", sizes[name],
                                 "rows"])
            for name in names[1:]]


def checked_batch(numerical, categorical, numerical_features, categorical_features, cardinalities=None):
    """``(numerical, categorical)`` once the served batch is checked: ``numerical`` ``[b, len(numerical_features)]``,
    ``categorical`` ``[b, len(categorical_features)]``, the same ``b``, and with ``cardinalities`` every id of
    column ``j`` in ``[0, cardinalities[j])`` (tables share one fused variable: an id past its table would read
    the next table's rows). A wrong batch stops with ``InvalidArgumentError: assertion failed: [<message>]``."""
    numerical_features, categorical_features = list(numerical_features), list(categorical_features)
    numerical_check, numerical_rows = _shape_check("numerical", numerical, tf.TensorShape([None, len(numerical_features)]),
                                                   f"one float per numerical feature {numerical_features}")
    categorical_check, categorical_rows = _shape_check(
        "categorical", categorical, tf.TensorShape([None, len(categorical_features)]),
        f"one id per categorical feature {categorical_features}")
    shapes = [numerical_check, categorical_check]
    shapes += _batch_asserts({"numerical": numerical_rows, "categorical": categorical_rows})
    with tf.control_dependencies(shapes):  # widths first: the range check below broadcasts per column
        ranges = []
        if cardinalities is not None and categorical_features:
            ranges = [_range_assert(categorical, categorical_features, list(cardinalities))]
        with tf.control_dependencies(ranges):
            return tf.identity(numerical), tf.identity(categorical)


def _range_assert(categorical, features: list, cardinalities: list):
    """Asserts every id of column ``j`` lies in ``[0, cardinalities[j])``, naming the first sample, feature and id
    that does not."""
    bad = tf.logical_or(categorical < 0, categorical >= tf.constant([cardinalities], categorical.dtype))
    # A sentinel past the end makes the first bad position well defined (it is the sentinel when none is bad).
    flat_bad = tf.concat([tf.reshape(bad, [-1]), [True]], axis=0)
    flat_ids = tf.concat([tf.reshape(categorical, [-1]), tf.constant([-1], categorical.dtype)], axis=0)
    first = tf.argmax(tf.cast(flat_bad, tf.int32), output_type=tf.int64)
    width = len(features)
    return tf.debugging.Assert(
        tf.equal(first, tf.size(categorical, out_type=tf.int64)),
        [f"serving input 'categorical': ids must lie in [0, cardinality) of their column (cardinalities {cardinalities}); "
         "sample", first // width, "feature", tf.gather(tf.constant(features), first % width), "holds id",
         tf.gather(flat_ids, first)])


def input_name(feature: str) -> str:
    """The serving input of a feature: its name with each character a signature argument cannot hold
    (``cat_1.bin``'s dot) as ``_``; TensorFlow would otherwise rename it with a warning."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", feature)
    return name if re.match(r"[A-Za-z]", name) else f"f_{name}"


def flat_signature(input_signature: dict) -> list:
    """The plain ``tf.TensorSpec`` inputs of ``{name: TensorSpec or RaggedTensorSpec}``: a ragged input
    ``name`` becomes ``name_values`` (the ids of every row, concatenated) and ``name_row_lengths``."""
    flat = []
    for name, spec in input_signature.items():
        if isinstance(spec, tf.RaggedTensorSpec):
            if spec.ragged_rank != 1:
                raise ValueError(f"Expected ragged input {name!r} of ragged rank 1. Received: {spec}")
            flat += [tf.TensorSpec([None], spec.dtype, name=f"{name}_values"),
                     tf.TensorSpec([None], tf.int64, name=f"{name}_row_lengths")]
        else:
            flat.append(tf.TensorSpec(spec.shape, spec.dtype, name=name))
    return flat


def ragged_input(name: str, values, row_lengths) -> tf.RaggedTensor:
    """The ragged input ``name`` of its two serving inputs, once the row lengths are none negative and
    sum to the number of values."""
    checks = [
        tf.debugging.Assert(tf.reduce_all(row_lengths >= 0), [
            f"serving input '{name}_row_lengths': a row length is negative. Received: sample",
            tf.argmin(row_lengths, output_type=tf.int64), "length", tf.reduce_min(row_lengths)]),
        tf.debugging.Assert(tf.equal(tf.reduce_sum(row_lengths), tf.size(values, out_type=tf.int64)), [
            f"serving inputs '{name}_row_lengths' and '{name}_values': the row lengths must sum to the number of "
            "values. Received: sum", tf.reduce_sum(row_lengths), "values", tf.size(values, out_type=tf.int64)]),
    ]
    with tf.control_dependencies(checks):
        return tf.RaggedTensor.from_row_lengths(tf.identity(values), row_lengths, validate=False)


def checked_multi_hot(name: str, feature: str, ids, hotness: int, cardinality: int):
    """``ids`` of a multi-hot serving input (``[batch, hotness]``, or a ``tf.RaggedTensor`` of rows of 0 to
    ``hotness`` ids) once every row holds at most ``hotness`` ids and every id lies in ``[0, cardinality)``;
    a failed check names the input, feature, sample and the length or id."""
    ragged = ids if isinstance(ids, tf.RaggedTensor) else tf.RaggedTensor.from_tensor(ids)
    lengths = ragged.row_lengths()
    too_long = tf.concat([lengths > hotness, [True]], axis=0)  # a sentinel past the end: see _range_assert
    long_row = tf.argmax(tf.cast(too_long, tf.int32), output_type=tf.int64)
    values = ragged.values
    bad = tf.concat([tf.logical_or(values < 0, values >= cardinality), [True]], axis=0)
    first = tf.argmax(tf.cast(bad, tf.int32), output_type=tf.int64)
    rows = tf.concat([ragged.value_rowids(), [-1]], axis=0)
    padded = tf.concat([values, tf.constant([-1], values.dtype)], axis=0)
    checks = [
        tf.debugging.Assert(tf.equal(long_row, ragged.nrows()), [
            f"serving input {name!r}: feature {feature!r} holds at most hotness={hotness} ids per sample. Received: "
            "sample", long_row, "holds", tf.gather(tf.concat([lengths, [-1]], 0), long_row), "ids"]),
        tf.debugging.Assert(tf.equal(first, tf.size(values, out_type=tf.int64)), [
            f"serving input {name!r}: ids of feature {feature!r} must lie in [0, {cardinality}). Received: sample",
            tf.gather(rows, first), "holds id", tf.gather(padded, first)]),
    ]
    with tf.control_dependencies(checks):
        if isinstance(ids, tf.RaggedTensor):
            return ids.with_values(tf.identity(ids.values))
        return tf.identity(ids)


def checked_inputs(inputs: dict, input_signature: dict) -> dict:
    """``inputs`` (dense tensors and ragged ones, by name) once their shapes match ``input_signature`` and
    they hold one batch size."""
    asserts, sizes = [], {}
    for name, spec in input_signature.items():
        tensor = inputs[name]
        if isinstance(tensor, tf.RaggedTensor):
            sizes[name] = tensor.nrows(out_type=tf.int64)
        else:
            check, sizes[name] = _shape_check(name, tensor, spec.shape, f"{spec.dtype.name} values")
            asserts.append(check)
    asserts += _batch_asserts(sizes)
    with tf.control_dependencies(asserts):
        return {name: tensor.with_values(tf.identity(tensor.values)) if isinstance(tensor, tf.RaggedTensor)
                else tf.identity(tensor) for name, tensor in inputs.items()}


class _Serving(tf.Module):
    def __init__(self, model, input_signature: dict):
        super().__init__(name="tf_dlrm_serving")
        # The variables are tracked, not the Keras model: saving a Keras model object makes TensorFlow
        # trace its call with float inputs made up from its build shapes.
        self.model_variables = [getattr(v, "value", v) for v in model.variables]
        # Dynamic tables: each shard's key -> row map (saved with its contents) and row metadata.
        states = [state for layer in sublayers(model) if hasattr(layer, "local_shards")
                  for shard in layer.local_shards for state in layer.states[shard]]
        self.key_maps = [state.map for state in states]
        self.row_metadata = [v for state in states for v in (state.occupied, state.row_key)]
        call = model.__call__
        self.ragged = sorted(name for name, spec in input_signature.items() if isinstance(spec, tf.RaggedTensorSpec))
        flat = flat_signature(input_signature)
        self.names = list(input_signature)
        self.flat_names = [spec.name for spec in flat]

        def serve(*tensors):
            inputs, given = {}, dict(zip(self.flat_names, tensors))
            for name in self.names:
                if name in self.ragged:
                    inputs[name] = ragged_input(name, given[f"{name}_values"], given[f"{name}_row_lengths"])
                else:
                    inputs[name] = given[name]
            return {"output": call(checked_inputs(inputs, input_signature), training=False)}

        self.serve = tf.function(serve, input_signature=flat)


def own_kernels(function) -> list[str]:
    """The tf_dlrm kernels (ops named ``TfDlrm*``) a ``tf.function`` with an input signature runs: a SavedModel
    holding one loads only where tf_dlrm's kernel library is loaded first."""
    graph = function.get_concrete_function().graph.as_graph_def()
    used = {node.op for node in graph.node} | {node.op for function in graph.library.function for node in function.node_def}
    return sorted(op for op in used if op.startswith("TfDlrm"))


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
    for layer in sublayers(model):
        env = getattr(layer, "env", None)
        if env is not None and env.world_size > 1:
            raise ValueError(f"Expected a model in one process (every table whole). Received: layer {layer.name!r} "
                             f"on {env.world_size} ranks: restore its checkpoint into a one-process model first")
    if os.path.exists(path):
        raise ValueError(f"Expected a new SavedModel path. Received: {path!r}, which exists")
    module = _Serving(model, dict(input_signature))
    custom = own_kernels(module.serve)
    if custom:
        raise ValueError(f"The serving graph uses tf_dlrm's own kernels {custom}, which plain TensorFlow cannot load: "
                         "build the serving model in a process started with TF_DLRM_DISABLE_KERNELS=1")
    temporary = f"{path.rstrip(os.sep)}.tmp"
    shutil.rmtree(temporary, ignore_errors=True)
    tf.saved_model.save(module, temporary, signatures={"serving_default": module.serve})
    os.rename(temporary, path)
    return path
