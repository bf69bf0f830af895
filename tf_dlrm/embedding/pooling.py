"""Lookup and pooling of several features in one fused table variable.

Each *entry* is one feature reading one table slice stored in the fused variable at a row offset.
When every entry is one-hot they share one gather ``[n, E, w]``. Otherwise each entry is pooled on
its own: one-hot entries gather ``[n, w]``; multi-hot entries (fixed hotness as a ``RaggedTensor``
of uniform row length, or ragged) take their distinct ids (``tf.unique``), gather each distinct row
once and sum each sample's rows with one ``sparse_segment_sum``; the entries' ``[n, w]`` blocks are
put side by side into the same ``[n, E * w]`` block as the one-hot case: a multi-hot feature costs
the exchange bytes of a one-hot one. ``mean`` / ``sqrtn`` scale the pooled sums by ``1 / count``
or ``1 / sqrt(count)`` afterwards (``n`` multiplies per entry, not one per id).

Backward: the gradient of ``sparse_segment_sum`` adds the pooled gradients of every occurrence of
an id (duplicates within a sample and across the batch accumulated) into one row per distinct id,
and the gradient of the gather is ``IndexedSlices`` over the distinct rows: the sparse update
touches each row of an entry once (rows of a table read by several features once per feature).

A weighted entry (``(ids, row_offset, combiner, weights)``, the weights aligned with ``ids.values``)
gathers a row per id, scales it by its weight and sums each sample's rows; ``mean`` divides by the
sample's sum of weights, ``sqrtn`` by the square root of its sum of squared weights. The gradient of
the scaling multiplies each id's pooled gradient by its weight; the gather's gradient keeps a row per
id (duplicates accumulated by the sparse update). The kernel has no weights: weighted entries take
TensorFlow's ops.

With ``kernel=True`` the whole function is one op of tf_dlrm's kernel library instead
(:func:`tf_dlrm.ops.embedding_bag.bag_lookup`: same values; a gradient over distinct rows).
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tf_dlrm.ops.embedding_bag import bag_lookup
from tf_dlrm.embedding.exchange import gather_rows
from tf_dlrm.embedding.table_config import FeatureConfig


def normalize_ids(ids, feature: FeatureConfig, rows: int, validate: bool = True):
    """The ids of ``feature`` as a 1-D tensor (one-hot) or a ``tf.RaggedTensor`` (multi-hot).

    Raises (at trace time when the shape tells, else when run) naming the feature: more ids per
    sample than ``hotness``, a dense input for a ragged feature, an id outside ``[0, rows)``.
    """
    if isinstance(ids, tf.SparseTensor):
        ids = tf.RaggedTensor.from_sparse(ids)
    if isinstance(ids, tf.RaggedTensor):
        if ids.shape.rank != 2:
            raise ValueError(f"Expected ragged ids of feature {feature.name!r} with shape [batch, None]. "
                             f"Received: shape={ids.shape}")
        checks = []
        if validate:
            longest = tf.reduce_max(tf.concat([ids.row_lengths(), tf.zeros([1], ids.row_splits.dtype)], 0))
            checks.append(tf.debugging.assert_less_equal(
                longest, tf.cast(feature.hotness, longest.dtype),
                message=f"feature {feature.name!r}: a sample has more ids than its hotness {feature.hotness}"))
            checks.append(_range_check(ids.values, feature, rows))
        if checks:
            with tf.control_dependencies(checks):
                ids = tf.RaggedTensor.from_row_splits(tf.identity(ids.values), ids.row_splits, validate=False)
        return ids
    ids = tf.convert_to_tensor(ids)
    if ids.shape.rank == 1 and feature.hotness == 1 and not feature.ragged and not feature.one_hot:
        # A weighted or sequence feature of one id per sample pools like a multi-hot one of length 1.
        ids = ids[:, None]
    if ids.shape.rank == 2 and ids.shape[1] == 1 and feature.one_hot:
        ids = tf.reshape(ids, [-1])
    if ids.shape.rank == 1:
        if not feature.one_hot:
            kind = "ragged" if feature.ragged else f"hotness {feature.hotness}"
            raise ValueError(f"Feature {feature.name!r} is {kind}: expected ids of shape [batch, "
                             f"{'None' if feature.ragged else feature.hotness}]. Received: shape={ids.shape}")
        return _checked(ids, feature, rows) if validate else ids
    if ids.shape.rank != 2:
        raise ValueError(f"Expected ids of feature {feature.name!r} of shape [batch] or [batch, hotness]. "
                         f"Received: shape={ids.shape}")
    hotness = ids.shape[1]
    if hotness is None or hotness > feature.hotness or (hotness != feature.hotness and not feature.ragged):
        raise ValueError(f"Feature {feature.name!r} has hotness {feature.hotness}"
                         f"{' (at most, ragged)' if feature.ragged else ''}: expected ids of shape [batch, "
                         f"{feature.hotness}]. Received: shape={ids.shape} (more ids per sample than declared?)")
    if validate:
        ids = _checked(ids, feature, rows)
    return tf.RaggedTensor.from_uniform_row_length(tf.reshape(ids, [-1]), hotness, validate=False)


def normalize_weights(weights, ids: tf.RaggedTensor, feature: FeatureConfig) -> tf.Tensor:
    """The weights of a weighted ``feature`` as float32 values aligned with ``ids.values`` (``ids`` from
    :func:`normalize_ids`): a ragged tensor with the ids' row lengths, or a dense one of their shape.

    Raises (at trace time when the shapes tell, else when run) naming the feature when the weights do not
    match the ids one for one."""
    if weights is None:
        raise ValueError(f"Feature {feature.name!r} is weighted: expected its weights beside its ids "
                         "(call the layer with weights={name: weights}). Received: no weights")
    if isinstance(weights, tf.SparseTensor):
        weights = tf.RaggedTensor.from_sparse(weights)
    message = f"feature {feature.name!r}: the weights do not match the ids one for one (row lengths differ)"
    if isinstance(weights, tf.RaggedTensor):
        if weights.shape.rank != 2:
            raise ValueError(f"Expected ragged weights of feature {feature.name!r} with shape [batch, None]. "
                             f"Received: shape={weights.shape}")
        check = tf.debugging.assert_equal(tf.cast(weights.row_splits, tf.int64), tf.cast(ids.row_splits, tf.int64),
                                          message=message)
        values = weights.values
    else:
        weights = tf.convert_to_tensor(weights)
        if weights.shape.rank not in (1, 2):
            raise ValueError(f"Expected weights of feature {feature.name!r} of shape [batch] or [batch, hotness]. "
                             f"Received: shape={weights.shape}")
        # Dense weights: every sample has as many ids as the weights' row.
        width = 1 if weights.shape.rank == 1 else tf.shape(weights, out_type=tf.int64)[1]
        count = tf.shape(weights, out_type=tf.int64)[0]
        check = tf.debugging.assert_equal(tf.cast(ids.row_splits, tf.int64), tf.range(count + 1, dtype=tf.int64) * width,
                                          message=message)
        values = tf.reshape(weights, [-1])
    with tf.control_dependencies([check]):
        return tf.cast(tf.identity(values), tf.float32)


def weighted_pool(rows: tf.Tensor, ids: tf.RaggedTensor, weights: tf.Tensor, combiner: str) -> tf.Tensor:
    """``[n, w]``: ``rows`` (``[ids, w]``, one per id of ``ids``) times their ``weights``, summed per sample
    and scaled by the weighted combiner's factor (an all-zero-weight sample gives zeros)."""
    samples = tf.cast(ids.value_rowids(), tf.int32)
    n = batch_size(ids)
    summed = tf.math.unsorted_segment_sum(rows * weights[:, None], samples, n)
    if combiner == "sum":
        return summed
    return tf.math.divide_no_nan(summed, weight_total(weights, samples, n, combiner)[:, None])


def weight_total(weights: tf.Tensor, samples: tf.Tensor, n, combiner: str) -> tf.Tensor:
    """``[n]``: what a weighted ``mean`` (the sum of a sample's weights) or ``sqrtn`` (the square root of the
    sum of their squares) divides the sample's weighted sum by."""
    if combiner == "mean":
        return tf.math.unsorted_segment_sum(weights, samples, n)
    return tf.sqrt(tf.math.unsorted_segment_sum(weights * weights, samples, n))


def band_entry(ids, weights, combiner: str, row_start: int, row_end: int) -> tuple[tf.RaggedTensor, tf.Tensor | None]:
    """The part of an entry that a row band ``[row_start, row_end)`` of its table pools, as a ``sum`` entry:
    ``(ragged ids - row_start, weights or None)`` keeping the ids inside the band.

    The bands' pooled vectors add up to the entry's own: the combiner's factor is the whole sample's
    (``1 / count`` or ``1 / sqrt(count)``, or the weighted ones of :func:`weighted_pool`), carried as a
    weight per kept id. Ids outside the band are dropped, so their rows here get no gradient (a zero
    gradient would still move an Adam or Adagrad row)."""
    if not isinstance(ids, tf.RaggedTensor):  # one-hot: one id per sample
        ids = tf.RaggedTensor.from_uniform_row_length(tf.reshape(ids, [-1]), 1, validate=False)
        combiner = "sum"
    values = ids.values
    inside = tf.logical_and(values >= tf.cast(row_start, values.dtype), values < tf.cast(row_end, values.dtype))
    samples = tf.cast(ids.value_rowids(), tf.int32)
    n = batch_size(ids)
    factor = None
    if weights is None and combiner != "sum":
        factor = combiner_scale(ids, combiner)
    elif weights is not None and combiner != "sum":
        total = weight_total(weights, samples, n, combiner)
        factor = tf.math.divide_no_nan(tf.ones_like(total), total)
    if factor is not None:
        weights = tf.gather(factor, samples) * (1.0 if weights is None else weights)
    kept = tf.RaggedTensor.from_value_rowids(tf.boolean_mask(values, inside) - tf.cast(row_start, values.dtype),
                                             tf.boolean_mask(ids.value_rowids(), inside), nrows=tf.cast(n, ids.row_splits.dtype),
                                             validate=False)
    return kept, None if weights is None else tf.boolean_mask(weights, inside)


def _range_check(values, feature: FeatureConfig, rows: int):
    # One unsigned compare catches negative ids (e.g. a -1 pad) and ids >= rows alike.
    inside = tf.reduce_all(tf.cast(values, tf.uint64) < tf.constant(rows, tf.uint64))
    # The message alone: data tensors of an Assert are computed every step, even when it holds.
    return tf.debugging.Assert(inside, [f"feature {feature.name!r}: an id is outside [0, {rows}) (there are no "
                                        f"pad ids: every id must be >= 0 and < the table's rows)"])


def _checked(ids, feature, rows):
    with tf.control_dependencies([_range_check(ids, feature, rows)]):
        return tf.identity(ids)


def batch_size(ids) -> tf.Tensor:
    return ids.nrows(out_type=tf.int32) if isinstance(ids, tf.RaggedTensor) else tf.shape(ids, out_type=tf.int32)[0]


def combiner_scale(ids: tf.RaggedTensor, combiner: str) -> tf.Tensor | None:
    """``[n]`` factors turning per-sample sums into the combiner's result (None for ``sum``)."""
    if combiner == "sum":
        return None
    # An empty sample sums to zero; max(count, 1) keeps it zero instead of 0/0.
    count = tf.maximum(tf.cast(ids.row_lengths(), tf.float32), 1.0)
    return 1.0 / count if combiner == "mean" else tf.math.rsqrt(count)


def pooled_lookup(variable, entries: Sequence[tuple], index_dtype: tf.DType, kernel: bool = False, checks=None,
                  dtype: tf.DType = tf.float32) -> tf.Tensor:
    """``[n, E * w]``: entry ``e = (ids, row_offset, combiner[, weights])`` pooled into columns ``[e*w, (e+1)*w)``.

    All entries share one batch size ``n``; ``variable`` is ``[rows of all slices, w]``. ``kernel``:
    pool with tf_dlrm's embedding-bag kernel (the caller checked that it is loaded), which checks
    the ids itself (``checks``: see :func:`tf_dlrm.ops.embedding_bag.bag_lookup`). ``dtype``: the
    dtype the caller casts the result to; when every entry is one-hot the rows may arrive in it (see
    :func:`tf_dlrm.embedding.exchange.gather_rows`), otherwise the result is float32.
    """
    if kernel:
        # The layer sends no weighted entry to the kernel (it takes no weights): their weights are None.
        return bag_lookup(variable, [entry[:3] for entry in entries], index_dtype, checks)
    width = int(variable.shape[1])
    count = len(entries)
    if all(not isinstance(entry[0], tf.RaggedTensor) for entry in entries):
        fused = tf.stack([tf.cast(ids, index_dtype) + offset for ids, offset, *_ in entries], axis=1)
        vectors = gather_rows(variable, fused, dtype)  # [n, E, w]
        return tf.reshape(vectors, [-1, count * width])
    pooled = []
    # A split bf16 table's rows are pooled in float32 (bf16 sums of many rows would lose bits).
    pool_dtype = tf.float32
    for ids, offset, combiner, *weights in entries:
        if not isinstance(ids, tf.RaggedTensor):  # one-hot
            pooled.append(tf.cast(gather_rows(variable, tf.cast(ids, index_dtype) + offset), pool_dtype))
            continue
        if weights and weights[0] is not None:
            rows = tf.cast(gather_rows(variable, tf.cast(ids.values, index_dtype) + offset), pool_dtype)
            pooled.append(weighted_pool(rows, ids, weights[0], combiner))
            continue
        # Per entry, not over the whole fused variable: one entry's distinct ids span one table,
        # so unique's hash map, the gathered rows and the gradient's scattered sums stay small
        # enough for the caches (fused over all tables of a width they are not: see
        # benchmarks/multi_hot_throughput.py), and the entries' ops run in parallel.
        unique, positions = tf.unique(tf.cast(ids.values, index_dtype) + offset, out_idx=tf.int32)
        summed = tf.sparse.segment_sum(tf.cast(gather_rows(variable, unique), pool_dtype), positions, tf.cast(ids.value_rowids(), tf.int32),
                                       num_segments=batch_size(ids))
        scale = combiner_scale(ids, combiner)
        pooled.append(summed if scale is None else summed * scale[:, None])
    return tf.concat(pooled, axis=1) if len(pooled) > 1 else pooled[0]
