"""Pooled lookups through tf_dlrm's embedding-bag kernel (``tf_dlrm/ops/embedding_bag.cc``).

:func:`bag_lookup` pools every entry ``(ids, row_offset, combiner)`` of one fused variable with one
op, written straight into the ``[n, E * w]`` block that :func:`tf_dlrm.embedding.pooling.pooled_lookup`
returns (no gathered ``[ids, w]`` tensor, no concat). Its gradient (registered below) is one
``IndexedSlices`` over the *distinct* fused rows the entries read, each row's gradient summed over all
its occurrences (duplicate ids in a sample, across the batch, and across features sharing a table).
A variable read this way is marked (:func:`mark_distinct_rows`) so that the sparse update skips its
own ``unique`` + segment sum (:mod:`tf_dlrm.embedding.sparse_update`), and plain SGD updates its rows with
one multi-threaded op (:func:`apply_sgd_to_distinct_rows`) instead of TensorFlow's single-threaded
sparse update.

Without the kernel library (:func:`tf_dlrm.ops.kernels` is None; it logs why once) the layer keeps
the plain TensorFlow path: the same values, duplicate rows in the gradient, slower.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tf_dlrm.ops import kernels

try:
    # The op reads tables through their handles, so it must tell the tape itself that they were read
    # (a ReadVariableOp would). TensorFlow has no public call for this: without it, the plain path.
    from tensorflow.python.eager.tape import variable_accessed
except ImportError:
    variable_accessed = None

_DISTINCT_ROWS = "tf_dlrm_gradient_rows_distinct"


def bag_kernel():
    """The kernel library when it has the embedding-bag ops, else None."""
    library = kernels()
    usable = library is not None and hasattr(library, "tf_dlrm_embedding_bag") and variable_accessed is not None
    return library if usable else None


def mark_distinct_rows(variable):
    """Marks ``variable`` as read only by :func:`bag_lookup`, once per step: its gradient's rows
    are distinct. (A model calling the same embedding layer twice in one step would get two sets of
    rows joined by the tape; the layer's docstring says it reads its variables once per call.)"""
    setattr(variable, _DISTINCT_ROWS, True)
    return variable


def distinct_rows(variable) -> bool:
    """Whether ``variable``'s gradient rows are distinct: it is read by the kernel, which is on where the
    step is traced (inside :func:`tf_dlrm.ops.kernels_off` the layer reads it with TensorFlow's ops)."""
    return bool(getattr(variable, _DISTINCT_ROWS, False)) and bag_kernel() is not None


def _tf_variable(variable) -> tf.Variable:
    """The ``tf.Variable`` under a Keras 3 variable (or the variable itself)."""
    return variable if isinstance(variable, tf.Variable) else variable.value


def _as_values_and_splits(ids, index_dtype: tf.DType):
    if isinstance(ids, tf.RaggedTensor):
        return tf.cast(ids.values, index_dtype), tf.cast(ids.row_splits, tf.int64)
    # One-hot [n]: one id per sample.
    count = tf.shape(ids, out_type=tf.int64)[0]
    return tf.cast(ids, index_dtype), tf.range(count + 1, dtype=tf.int64)


def bag_lookup(variable, entries: Sequence[tuple], index_dtype: tf.DType, checks: Sequence[tuple] | None = None) -> tf.Tensor:
    """``[n, E * w]`` float32: entry ``e = (ids, row_offset, combiner)`` pooled into columns
    ``[e*w, (e+1)*w)`` of ``variable`` (a Keras or tf variable ``[rows, w]``, float32); ids are
    1-D (one-hot) or ``tf.RaggedTensor`` (multi-hot), all of one batch size ``n``.

    ``checks``: per entry ``(feature name, table rows, hotness or 0)``: the kernel refuses, naming
    the feature, an id outside ``[0, table rows)`` and (hotness > 0) a sample with more ids. Without
    them it refuses ids past the variable's last row. It never reads outside the variable."""
    width = int(variable.shape[1])
    placed = [(ids, offset, combiner, 0, e * width) for e, (ids, offset, combiner) in enumerate(entries)]
    return multi_table_bag_lookup([variable], placed, index_dtype, checks)


def multi_table_bag_lookup(variables: Sequence, entries: Sequence[tuple], index_dtype: tf.DType,
                           checks: Sequence[tuple] | None = None) -> tf.Tensor:
    """``[n, sum of entry widths]`` float32 from several variables in one op: entry
    ``(ids, row_offset, combiner, variable index, first column)`` pools rows of ``variables[index]``
    into columns ``[first column, first column + its width)``; the entries' columns must tile the
    output. One op instead of one per variable plus a concat and a permutation: the layer writes
    its output in feature order directly when nothing else joins it (one process)."""
    library = bag_kernel()
    if library is None:
        raise RuntimeError("tf_dlrm's embedding-bag kernel is not loaded (python -m tf_dlrm.ops.build)")
    pairs = [_as_values_and_splits(entry[0], index_dtype) for entry in entries]
    tables = [_tf_variable(v) for v in variables]
    # The op reads the handles, not the values: tell active tapes, as a variable's own reads do, so
    # that a tape watching trainable variables automatically records this read.
    for table in tables:
        variable_accessed(table)
    widths = [int(v.shape[1]) for v in variables]
    return library.tf_dlrm_embedding_bag(
        tables=[t.handle for t in tables], values=[v for v, _ in pairs], row_splits=[s for _, s in pairs],
        offsets=[int(e[1]) for e in entries], combiners=[str(e[2]) for e in entries],
        table_of=[int(e[3]) for e in entries], columns=[int(e[4]) for e in entries], widths=widths,
        output_width=sum(widths[int(e[3])] for e in entries), names=[str(n) for n, _, _ in checks or ()],
        limits=[int(r) for _, r, _ in checks or ()], hotness=[int(h) for _, _, h in checks or ()])


@tf.RegisterGradient("TfDlrmEmbeddingBag")
def _bag_gradient(op, upstream):
    tables, count = op.get_attr("T"), op.get_attr("E")
    values, splits = op.inputs[tables:tables + count], op.inputs[tables + count:]
    combiners = [c.decode() if isinstance(c, bytes) else c for c in op.get_attr("combiners")]
    outputs = bag_kernel().tf_dlrm_embedding_bag_grad(
        gradient=upstream, values=values, row_splits=splits, offsets=op.get_attr("offsets"), combiners=combiners,
        table_of=op.get_attr("table_of"), columns=op.get_attr("columns"), widths=op.get_attr("widths"),
        output_width=op.get_attr("output_width"), T=tables)
    rows, summed = outputs
    gradients = []
    for t in range(tables):
        shape = tf.raw_ops.VariableShape(input=op.inputs[t], out_type=rows[t].dtype)
        gradients.append(tf.IndexedSlices(summed[t], rows[t], shape))
    return gradients + [None] * (2 * count)


def gather_rows_as(variable, ids: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """``tf.cast(variable[ids], dtype)`` of a float32 ``[rows, w]`` variable in one op, without a float32
    copy of the rows; its gradient is ``IndexedSlices`` of ``dtype`` values (repeated rows kept), which
    :func:`apply_sgd_to_repeated_rows` and :func:`apply_sgd_to_distinct_rows` take as they are (the
    other optimizers cast them to float32 first). Needs the kernel library (:func:`bag_kernel`)."""
    table = _tf_variable(variable)
    variable_accessed(table)  # the op reads the handle: tell active tapes, as a variable's own reads do
    ids = tf.convert_to_tensor(ids)
    rows = bag_kernel().tf_dlrm_gather_rows(table=table.handle, indices=tf.reshape(ids, [-1]), T=dtype)
    width = int(variable.shape[1])
    return tf.ensure_shape(tf.reshape(rows, tf.concat([tf.shape(ids), [width]], axis=0)), ids.shape.concatenate([width]))


@tf.RegisterGradient("TfDlrmGatherRows")
def _gather_rows_gradient(op, upstream):
    ids = op.inputs[1]
    shape = tf.raw_ops.VariableShape(input=op.inputs[0], out_type=ids.dtype)
    return [tf.IndexedSlices(upstream, ids, shape), None]


def apply_sgd_to_distinct_rows(variable, gradient: tf.IndexedSlices, learning_rate) -> None:
    """``variable[rows] -= learning_rate * values`` for a gradient whose rows are distinct (from
    :func:`bag_lookup`), on all CPU threads: distinct rows are written by one thread each."""
    bag_kernel().tf_dlrm_sparse_apply_sgd(table=_tf_variable(variable).handle, rows=gradient.indices, gradient=gradient.values,
                                          learning_rate=tf.cast(learning_rate, tf.float32))


def apply_sgd_to_repeated_rows(variable, gradient: tf.IndexedSlices, learning_rate) -> None:
    """``variable[rows] -= learning_rate * values`` for a gradient with repeated rows, each row's
    entries applied one after another in their order, on all CPU threads (each its own columns)."""
    bag_kernel().tf_dlrm_sparse_apply_sgd(table=_tf_variable(variable).handle, rows=gradient.indices, gradient=gradient.values,
                                          learning_rate=tf.cast(learning_rate, tf.float32), distinct_rows=False)


def apply_lazy_adam_to_distinct_rows(variable, m, v, rows, gradient, alpha, beta_1: float, beta_2: float,
                                     epsilon: float) -> bool:
    """Lazy Adam on distinct ``rows`` in one multi-threaded pass over the table and both moments
    (:class:`tf_dlrm.optimizers.lazy_adam.SparseLazyAdam` has the formula); False (nothing done) without
    the kernel library."""
    library = bag_kernel()
    if library is None:
        return False
    library.tf_dlrm_sparse_apply_lazy_adam(
        table=_tf_variable(variable).handle, m=_tf_variable(m).handle, v=_tf_variable(v).handle, rows=rows,
        gradient=gradient, alpha=tf.cast(alpha, tf.float32), beta_1=beta_1, beta_2=beta_2,
        one_minus_beta_1=1.0 - beta_1, one_minus_beta_2=1.0 - beta_2, epsilon=epsilon)
    return True
