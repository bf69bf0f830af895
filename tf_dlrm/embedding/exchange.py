"""The embedding exchange's tensor helpers, used by DistributedEmbedding (the layout, pure
Python, is :mod:`tf_dlrm.sharding.packing`).

- Tensor helpers: row gathers that read only the rows asked for, a permutation whose gradient is a
  gather too, the embedding alltoall (:func:`exchange_block`) and its bfloat16 wire format (Horovod
  0.28 has no bfloat16 alltoall).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_dlrm.ops.embedding_bag import bag_kernel, gather_rows_as
from tf_dlrm.parallel import collectives
from tf_dlrm.parallel.env import DistributedEnv


def gather_rows(variable, ids: tf.Tensor, dtype: tf.DType = tf.float32) -> tf.Tensor:
    """``variable[ids]`` with one op that reads only the rows asked for.

    ``tf.gather`` on a Keras variable first reads the whole variable (``ReadVariableOp``), and once
    a variable has been updated by scatter ops TensorFlow keeps it in copy-on-read mode: that read
    copies the whole table every step. The underlying ``tf.Variable`` is gathered from directly
    (the tables are created with ``autocast=False``, so ``.value`` is never a cast copy).

    ``dtype``: bfloat16 rows of a float32 table come from tf_dlrm's kernel in one pass, rounded as a
    cast rounds, with a bfloat16 gradient (:func:`tf_dlrm.ops.embedding_bag.gather_rows_as`); without
    the kernel library, or for other dtypes, the rows are gathered and cast. Either way the same values.
    """
    if dtype == tf.bfloat16 and tf.as_dtype(variable.dtype) == tf.float32 and bag_kernel() is not None:
        return gather_rows_as(variable, ids, dtype)
    rows = tf.gather(variable.value, ids)
    return rows if dtype == rows.dtype else tf.cast(rows, dtype)


def index_dtype(total_rows: int) -> tf.DType:
    """int32 ids when a fused variable's rows fit: no int64 casts, half the id bytes."""
    return tf.int32 if total_rows < np.iinfo(np.int32).max else tf.int64


def block_size(permutation: np.ndarray, size: int) -> int:
    """The largest ``g`` such that ``permutation`` (of ``size`` entries) moves whole aligned blocks
    of ``g`` consecutive entries: e.g. 128 when whole tables of dim 128 change places."""
    common = int(np.gcd(len(permutation), size))
    for g in sorted((d for d in range(1, common + 1) if common % d == 0), reverse=True):
        starts = permutation[::g]
        if np.all(starts % g == 0) and np.array_equal(permutation, (starts[:, None] + np.arange(g)).reshape(-1)):
            return g
    return 1


def permute(tensor: tf.Tensor, permutation: np.ndarray, axis: int) -> tf.Tensor:
    """``tf.gather(tensor, permutation, axis)`` for a permutation that may skip entries (padding
    columns, whose gradient is zero), made cheap in both directions.

    TensorFlow gathers along an inner axis one element at a time, and its generic gradient is two
    transposes and a segment sum. Columns of a ``[b, W]`` block move as whole table slices, so they
    are gathered as blocks of :func:`block_size` columns (one memcpy per block), and the gradient
    is the inverse gather, written by hand.
    """
    size = int(tensor.shape[axis])
    if len(permutation) == size and np.array_equal(permutation, np.arange(size)):
        return tensor
    block = block_size(permutation, size) if tensor.shape.rank == 2 and axis == 1 else 1
    if block == 1:
        return _gather_with_inverse(tensor, permutation, axis)
    blocks = tf.reshape(tensor, [-1, size // block, block])
    moved = _gather_with_inverse(blocks, permutation[::block] // block, axis=1)
    return tf.reshape(moved, [-1, len(permutation)])


def _gather_with_inverse(tensor: tf.Tensor, permutation: np.ndarray, axis: int) -> tf.Tensor:
    size = int(tensor.shape[axis])
    # inverse[j]: where entry j of the input went; entries that were skipped read an appended zero.
    inverse = np.full(size, len(permutation), dtype=np.int32)
    inverse[permutation] = np.arange(len(permutation), dtype=np.int32)
    complete = len(permutation) == size

    @tf.custom_gradient
    def forward(values):
        def backward(upstream):
            if not complete:
                zero_shape = tf.tensor_scatter_nd_update(tf.shape(upstream), [[axis]], [1])
                upstream = tf.concat([upstream, tf.zeros(zero_shape, upstream.dtype)], axis=axis)
            return tf.gather(upstream, inverse, axis=axis)

        return tf.gather(values, permutation, axis=axis), backward

    return forward(tensor)


def bfloat16_alltoall(env: DistributedEnv, flat: tf.Tensor, received_splits, name: str) -> tf.Tensor:
    """``alltoall`` of a 1-D bfloat16 tensor (equal parts to every rank), sent as its 16-bit patterns.

    Horovod 0.28 has no bfloat16 type; a bitcast to uint16 is exact and keeps the halved bytes.
    A bitcast has no gradient, so the backward is written here as Horovod writes its own: the
    upstream gradient goes back with ``received_splits`` (what each source rank sent here).
    """

    @tf.custom_gradient
    def exchange(values):
        received = collectives.alltoall(env, tf.bitcast(values, tf.uint16), name=name)

        def backward(upstream):
            returned = collectives.alltoall(env, tf.bitcast(upstream, tf.uint16), received_splits, name=f"{name}_grad")
            return tf.bitcast(returned, tf.bfloat16)

        return tf.bitcast(received, tf.bfloat16), backward

    return exchange(flat)


def exchange_block(env: DistributedEnv, local_block: tf.Tensor, local_batch, send_widths, name: str) -> tf.Tensor:
    """The embedding alltoall of ``local_block [B, W_r]`` (row block k to rank k): what every source
    sent here, flat, source s's ``[b, send_widths[s]]`` block after source s-1's."""
    flat = tf.reshape(local_block, [-1])
    if flat.dtype != tf.bfloat16:
        return collectives.alltoall(env, flat, name=name)
    world = env.world_size
    static_batch = local_block.shape[0] // world if local_block.shape[0] is not None else tf.get_static_value(local_batch)
    if static_batch is None:
        # The gradient's routing needs the local batch size; unknown at trace time, exchange float32.
        received = collectives.alltoall(env, tf.cast(flat, tf.float32), name=name)
        return tf.cast(received, tf.bfloat16)
    return bfloat16_alltoall(env, flat, [int(static_batch) * w for w in send_widths], name)
