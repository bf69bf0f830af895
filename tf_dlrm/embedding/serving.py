"""One serving signature for every model: a SavedModel served by plain TensorFlow (no tf_dlrm import).

    model = build_my_model()                       # trained here, on one process, kernels on or off
    export_saved_model(model, "serving/1", {"numerical": tf.TensorSpec([None, 3], tf.float32),
                                            "item": tf.TensorSpec([None], tf.int64),
                                            "history": tf.RaggedTensorSpec([None, None], tf.int64, 1)})

    loaded = tf.saved_model.load("serving/1")     # in any TensorFlow process
    loaded.signatures["serving_default"](numerical=..., item=..., history_values=..., history_row_lengths=...)
    # -> {"probability": [batch] float32, sigmoid of the model's logits}

    # Calibrated (tf_dlrm.calibration, fitted on held-out logits and labels): sigmoid(scale * logit + shift).
    export_saved_model(model, "serving/2", signature, calibration=calibration.fit(logits, labels, "platt"))

The signature takes one tensor per input of the model's dict (``{"numerical": [b, n] float32, <feature>:
ids}``), under :func:`input_name` (``cat_1.bin`` serves as ``cat_1_bin``); a ragged input ``name`` (a
``tf.RaggedTensorSpec``) becomes two, ``<name>_values`` (the ids of every row, concatenated) and
``<name>_row_lengths`` (ids per row), since signatures take plain tensors only. ``main.py --mode=export``
writes the same signature from a checkpoint (:mod:`tf_dlrm.cli.export`).

The model must hold every table whole (one process). The graph is traced inside
:func:`tf_dlrm.ops.kernels_off`: the embedding layer picks its kernel paths as it is traced, so a model
trained with tf_dlrm's kernels in this very process exports TensorFlow's ops only; a graph still holding a
``TfDlrm*`` op (a user's layer that chose one as it was built) is refused.

A signature checks dtypes but not shapes: a ``[batch, 9]`` tensor binds to a ``[None, 8]`` input and its
extra column would be dropped in silence. So the served function asserts, inside the graph (a plain
``tf.saved_model.load`` user gets the message), every known width, one batch size across its inputs, and
``sum(row_lengths) == size(values)`` of a ragged input (:func:`checked_inputs`, :func:`ragged_input`). Ids
outside their table and rows longer than a feature's hotness are refused by the embedding layer itself
(:func:`tf_dlrm.embedding.pooling.normalize_ids`), in the same graph.
"""

from __future__ import annotations

import os
import re
import shutil

import tensorflow as tf

from tf_dlrm.embedding.sublayers import sublayers
from tf_dlrm.ops import kernels_off


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


def input_name(feature: str) -> str:
    """The serving input of a feature: its name with each character a signature argument cannot hold
    (``cat_1.bin``'s dot) as ``_``; TensorFlow would otherwise rename it with a warning."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", feature)
    return name if re.match(r"[A-Za-z]", name) else f"f_{name}"


def served_names(input_signature: dict) -> dict:
    """``{model input name: [its serving inputs]}``: :func:`input_name` of each, a ragged one as
    ``<name>_values`` and ``<name>_row_lengths``. Raises ValueError when two inputs would share a
    serving name (``cat.1`` and ``cat_1``), or for a ragged input of ragged rank above 1."""
    served, taken = {}, {}
    for name, spec in input_signature.items():
        stem = input_name(name)
        if isinstance(spec, tf.RaggedTensorSpec):
            if spec.ragged_rank != 1:
                raise ValueError(f"Expected ragged input {name!r} of ragged rank 1. Received: {spec}")
            served[name] = [f"{stem}_values", f"{stem}_row_lengths"]
        else:
            served[name] = [stem]
        for flat in served[name]:
            if flat in taken:
                raise ValueError(f"Expected serving input names of their own. Received: inputs {taken[flat]!r} and "
                                 f"{name!r} both serve as {flat!r}")
            taken[flat] = name
    return served


def flat_signature(input_signature: dict) -> list:
    """The plain ``tf.TensorSpec`` inputs of ``{model input name: TensorSpec or RaggedTensorSpec}``, named
    by :func:`served_names`: a ragged input's values (the ids of every row, concatenated) and row lengths."""
    names, flat = served_names(input_signature), []
    for name, spec in input_signature.items():
        if isinstance(spec, tf.RaggedTensorSpec):
            values, lengths = names[name]
            flat += [tf.TensorSpec([None], spec.dtype, name=values), tf.TensorSpec([None], tf.int64, name=lengths)]
        else:
            flat.append(tf.TensorSpec(spec.shape, spec.dtype, name=names[name][0]))
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


def checked_inputs(inputs: dict, input_signature: dict) -> dict:
    """``inputs`` (dense tensors and ragged ones, by model input name) once their shapes match
    ``input_signature`` and they hold one batch size; messages name the serving inputs."""
    asserts, sizes = [], {}
    for name, spec in input_signature.items():
        tensor, served = inputs[name], input_name(name)
        if isinstance(tensor, tf.RaggedTensor):
            sizes[served] = tensor.nrows(out_type=tf.int64)
        else:
            what = f"{spec.dtype.name} values" + ("" if served == name else f" of {name!r}")
            check, sizes[served] = _shape_check(served, tensor, spec.shape, what)
            asserts.append(check)
    asserts += _batch_asserts(sizes)
    with tf.control_dependencies(asserts):
        return {name: tensor.with_values(tf.identity(tensor.values)) if isinstance(tensor, tf.RaggedTensor)
                else tf.identity(tensor) for name, tensor in inputs.items()}


class _Serving(tf.Module):
    """``model`` behind one signature: an input per model input (:func:`flat_signature`), out
    ``{"probability": [batch] float32}``, the sigmoid of the model's logits (with ``calibration``, a
    :class:`tf_dlrm.calibration.Calibration`, of ``scale * logit + shift``: constants of the graph).

    Made by :func:`serving_module`, which traces and checks it; written by :func:`save_module`.
    """

    def __init__(self, model, input_signature: dict, calibration=None):
        super().__init__(name="tf_dlrm_serving")
        # The variables are tracked, not the Keras model: saving a Keras model object makes TensorFlow
        # trace its call with float inputs made up from its build shapes.
        self.model_variables = [getattr(v, "value", v) for v in model.variables]
        # Dynamic tables: each shard's key -> row map (saved with its contents) and row metadata.
        states = [state for layer in sublayers(model) if hasattr(layer, "local_shards")
                  for shard in layer.local_shards for state in layer.states[shard]]
        self.key_maps = [state.map for state in states]
        self.row_metadata = [v for state in states for v in (state.occupied, state.row_key)]
        self.input_signature = dict(input_signature)
        self.served = served_names(self.input_signature)
        flat = flat_signature(self.input_signature)
        call = model.__call__

        def serve(*tensors):
            given, inputs = dict(zip([spec.name for spec in flat], tensors)), {}
            for name, spec in self.input_signature.items():
                if isinstance(spec, tf.RaggedTensorSpec):
                    values, lengths = self.served[name]
                    inputs[name] = ragged_input(input_name(name), given[values], given[lengths])
                else:
                    inputs[name] = given[self.served[name][0]]
            # Served in float32 whatever the compute dtype the model was trained under.
            logits = tf.cast(call(checked_inputs(inputs, self.input_signature), training=False), tf.float32)
            if calibration is not None:
                logits = logits * tf.constant(calibration.scale, tf.float32) + tf.constant(calibration.shift, tf.float32)
            return {"probability": tf.reshape(tf.sigmoid(logits), [-1])}

        self.serve = tf.function(serve, input_signature=flat)

    def inputs_info(self) -> dict:
        """``{serving input: {"dtype", "shape", "input"}}``: each signature argument and the model input it
        feeds (``shape`` with None for a size known only when served)."""
        info = {}
        for spec in flat_signature(self.input_signature):
            info[spec.name] = {"dtype": spec.dtype.name, "shape": spec.shape.as_list()}
        for name, flat in self.served.items():
            for served in flat:
                info[served]["input"] = name
        return info


def serving_module(model, input_signature: dict, calibration=None) -> "_Serving":
    """The serving module of ``model`` (built, every table in this process), its signature traced
    with TensorFlow's own ops (:func:`tf_dlrm.ops.kernels_off`).

    Args:
        model: a built Keras model called with a dict (``{"numerical": [b, n], <feature>: ids}``),
            returning logits.
        input_signature: ``{model input name: tf.TensorSpec or tf.RaggedTensorSpec}``.
        calibration: a :class:`tf_dlrm.calibration.Calibration` applied to the logits (None: none).

    Raises:
        ValueError: a layer on several ranks, two inputs of one serving name, or a graph still using
            tf_dlrm's own kernels.
    """
    for layer in sublayers(model):
        env = getattr(layer, "env", None)
        if env is not None and env.world_size > 1:
            raise ValueError(f"Expected a model in one process (every table whole). Received: layer {layer.name!r} "
                             f"on {env.world_size} ranks: restore its checkpoint into a one-process model first")
    module = _Serving(model, input_signature, calibration)
    with kernels_off():
        custom = own_kernels(module.serve)  # traces the signature here, inside the block
    if custom:
        raise ValueError(f"Expected a serving graph of TensorFlow's ops only. Received: tf_dlrm's kernels {custom}, which "
                         "plain TensorFlow cannot load (a layer of the model chose one as it was built)")
    return module


def save_module(module, path: str) -> None:
    """Writes ``module`` as a SavedModel at ``path`` (TensorFlow's ops only, as :func:`serving_module` traced it)."""
    with kernels_off():
        tf.saved_model.save(module, path, signatures={"serving_default": module.serve})


#CLASS

def dense_name(variable) -> str:
    """A dense variable's name without its model's: ``dlrm/bottom_mlp/dense_0/kernel`` -> ``bottom_mlp/dense_0/kernel``
    (the names checkpoints, exports and deltas use)."""
    path = variable.path
    return path.split("/", 1)[1] if "/" in path else path


def variable_map(model, module) -> dict:
    """Where ``module``'s SavedModel keeps each weight of ``model``: what :mod:`tf_dlrm.cli.apply_deltas` writes rows into.

    ``{"tables": [{"name", "rows", "dim", "pieces": [{"key", "offset", "columns"}]}], "dense": [{"name", "key",
    "shape"}]}``: ``key`` names a tensor of the SavedModel's ``variables/variables`` checkpoint, ``offset`` the row
    where the table starts in it (tables of one width share a fused variable), ``columns`` the table's columns it
    holds. Tables: those of the model's embedding layer; dense: its trainable dense variables.
    """
    from tf_dlrm.embedding.training_step import embedding_layer
    from tf_dlrm.embedding.variable_kind import VariableKind, variables_of_kind

    keys = {id(variable): f"model_variables/{index}/.ATTRIBUTES/VARIABLE_VALUE"
            for index, variable in enumerate(module.model_variables)}

    def key(variable):
        return keys[id(getattr(variable, "value", variable))]

    layer = embedding_layer(model)
    tables = []
    for index, table in enumerate([] if layer.plan is None else layer.plan.tables):
        pieces = [{"key": key(layer._piece_variable(piece)), "offset": piece.offset,
                   "columns": [piece.column_start, piece.column_end]} for piece in layer.table_pieces(index)]
        tables.append({"name": table.name, "rows": int(layer.cardinalities[index]), "dim": int(table.dim), "pieces": pieces})
    dense = [{"name": dense_name(v), "key": key(v), "shape": list(v.shape)}
             for v in variables_of_kind(model.trainable_variables, VariableKind.DENSE)]
    return {"tables": tables, "dense": dense, "dynamic": _dynamic_map(model, key)}


def _dynamic_map(model, key) -> list:
    """Per dynamic table: its rows in each shard's storage (``offset``, ``capacity``) and each shard's tensors: the
    storage, the key -> row map's keys and rows, and the rows' ``occupied`` and ``row_key`` (in :class:`_Serving`'s
    order of ``key_maps`` and ``row_metadata``)."""
    tables, index = [], 0
    for layer in sublayers(model):
        if not hasattr(layer, "local_shards"):
            continue
        for shard in layer.local_shards:
            for table, config in enumerate(layer.table_configs):
                if len(tables) <= table:
                    tables.append({"name": config.name, "dim": int(config.embedding_dim), "num_shards": int(layer.num_shards),
                                   "offset": int(layer.row_offsets[table]),
                                   "capacity": int(layer.row_offsets[table + 1] - layer.row_offsets[table]), "shards": {}})
                tables[table]["shards"][str(shard)] = {
                    "storage": key(layer.storage[shard]),
                    "map_keys": f"key_maps/{index}/.ATTRIBUTES/table-keys",
                    "map_rows": f"key_maps/{index}/.ATTRIBUTES/table-values",
                    "occupied": f"row_metadata/{2 * index}/.ATTRIBUTES/VARIABLE_VALUE",
                    "row_key": f"row_metadata/{2 * index + 1}/.ATTRIBUTES/VARIABLE_VALUE"}
                index += 1
    return tables


def own_kernels(function) -> list[str]:
    """The tf_dlrm kernels (ops named ``TfDlrm*``) a ``tf.function`` with an input signature runs: a SavedModel
    holding one loads only where tf_dlrm's kernel library is loaded first."""
    graph = function.get_concrete_function().graph.as_graph_def()
    used = {node.op for node in graph.node} | {node.op for function in graph.library.function for node in function.node_def}
    return sorted(op for op in used if op.startswith("TfDlrm"))


def export_saved_model(model, path: str, input_signature: dict, calibration=None) -> str:
    """Writes ``model`` (built, in one process) as a SavedModel at ``path`` (which must not exist;
    written beside it first, then renamed); returns ``path``.

    Args:
        model: a built Keras model holding every table (one process), trained with or without tf_dlrm's
            kernels.
        path: the SavedModel directory.
        input_signature: ``{model input name: tf.TensorSpec or tf.RaggedTensorSpec}`` of ``model``'s dict input.
        calibration: a :class:`tf_dlrm.calibration.Calibration` (:func:`tf_dlrm.calibration.fit` on held-out
            logits and labels) the served probabilities apply; None: the model's own.

    Raises:
        ValueError: several ranks, an existing ``path``, or what :func:`serving_module` refuses.
    """
    if os.path.exists(path):
        raise ValueError(f"Expected a new SavedModel path. Received: {path!r}, which exists")
    module = serving_module(model, input_signature, calibration)
    temporary = f"{path.rstrip(os.sep)}.tmp"
    shutil.rmtree(temporary, ignore_errors=True)
    save_module(module, temporary)
    os.rename(temporary, path)
    return path
