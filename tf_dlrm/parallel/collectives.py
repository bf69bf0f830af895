"""Thin wrappers of the Horovod collectives, so Horovod is imported in one place only.

Every function is a no-op (identity) with one rank. All ranks must call them in the same order.
"""

from __future__ import annotations

import json
import zlib
from typing import Sequence

import numpy as np
import tensorflow as tf

from tf_dlrm.parallel.env import DistributedEnv


def _hvd():
    import horovod.tensorflow as hvd

    return hvd


def alltoall(env: DistributedEnv, tensor: tf.Tensor, splits: Sequence[int] | None = None, name: str | None = None) -> tf.Tensor:
    """Sends ``splits[k]`` leading rows (equal parts when None) to rank k; returns what arrives, by source rank.

    ``splits`` may be a tensor (sizes known only when run, e.g. the ids of ragged features)."""
    if not env.distributed:
        return tensor
    hvd = _hvd()
    if splits is not None and not isinstance(splits, tf.Tensor):
        splits = tf.constant(list(splits), dtype=tf.int32)
    received = hvd.alltoall(tensor, splits=splits, name=name)
    # Horovod >= 0.21 returns (tensor, received_splits) when splits are given.
    return received[0] if isinstance(received, (tuple, list)) else received


def alltoall_with_splits(env: DistributedEnv, tensor: tf.Tensor, splits: tf.Tensor, name: str | None = None):
    """As :func:`alltoall` with tensor ``splits``; also returns how many rows came from each rank
    (what a reply must send back). With one rank: ``(tensor, splits)``."""
    if not env.distributed:
        return tensor, splits
    received, received_splits = _hvd().alltoall(tensor, splits=splits, name=name)
    return received, received_splits


def _tag(name: str | None, dtype: tf.DType) -> tf.Tensor:
    """A constant that differs between collectives of different names, the same on every rank.

    Horovod's ops are not marked stateful, so Grappler merges two allreduces of the same tensor
    (e.g. the gradients of two biases that both add to the logit) into one, keeping one of the two
    names; which one depends on the node order of each rank's graph, so ranks could disagree and
    wait for each other forever (a Wide & Deep step at 3 ranks did). A tag riding in each group
    makes the inputs of differently named collectives differ, so none is merged. A group takes one
    dtype: the tag is the name's CRC-32 as six hex digits, exact in every dtype."""
    crc = zlib.crc32((name or "").encode())
    return tf.constant([(crc >> (4 * digit)) & 15 for digit in range(6)], dtype)


def grouped_mean(env: DistributedEnv, tensors: Sequence[tf.Tensor], name: str | None = None) -> list[tf.Tensor]:
    """Averages each tensor over ranks in one grouped allreduce (never merged with another, see :func:`_tag`)."""
    if not env.distributed or not tensors:
        return list(tensors)
    hvd = _hvd()
    return list(hvd.grouped_allreduce(list(tensors) + [_tag(name, tensors[0].dtype)], op=hvd.Average, name=name))[:-1]


def allgather(env: DistributedEnv, tensor: tf.Tensor, name: str | None = None) -> tf.Tensor:
    """Concatenates every rank's tensor along axis 0, in rank order."""
    if not env.distributed:
        return tensor
    return _hvd().allgather(tensor, name=name)


def gather_to_root(env: DistributedEnv, tensor: tf.Tensor, name: str | None = None):
    """Every rank's ``tensor`` (any number of rows) concatenated along axis 0 in rank order on rank 0
    only; the other ranks receive nothing. Returns ``(rows, rows_per_rank)``: on rank 0 the whole
    concatenation and how many rows came from each rank, elsewhere an empty tensor and zeros.

    One alltoall in which every rank sends all its rows to rank 0 (Horovod has no gather), so the
    memory of the whole is spent on rank 0 alone, unlike :func:`allgather`.
    """
    if not env.distributed:
        return tensor, tf.constant([int(tensor.shape[0])], tf.int32)
    splits = tf.constant([int(tensor.shape[0])] + [0] * (env.world_size - 1), tf.int32)
    received, received_splits = _hvd().alltoall(tensor, splits=splits, name=name)
    return received, received_splits


def broadcast(env: DistributedEnv, tensor: tf.Tensor, root_rank: int = 0, name: str | None = None) -> tf.Tensor:
    if not env.distributed:
        return tensor
    return _hvd().broadcast(tensor, root_rank=root_rank, name=name)


def broadcast_variables(env: DistributedEnv, variables: Sequence, root_rank: int = 0) -> None:
    """Gives every rank rank 0's values of ``variables`` (used for dense weights at start)."""
    if not env.distributed or not variables:
        return
    hvd = _hvd()
    for variable in variables:
        value = hvd.broadcast(tf.convert_to_tensor(variable), root_rank=root_rank)
        variable.assign(value)


def barrier(env: DistributedEnv) -> None:
    if env.distributed:
        _hvd().allreduce(tf.constant(0.0), op=_hvd().Sum, name="barrier")


def sum_over_ranks(env: DistributedEnv, tensor: tf.Tensor, name: str | None = None) -> tf.Tensor:
    """The elementwise sum of ``tensor`` over ranks (an exact sum: no average to undo)."""
    if not env.distributed:
        return tensor
    hvd = _hvd()
    return hvd.grouped_allreduce([tensor, _tag(name, tensor.dtype)], op=hvd.Sum, name=name)[0]


def broadcast_json(env, value, name: str):
    """Rank 0's JSON-serialisable ``value`` on every rank (others pass anything, e.g. None)."""
    if not env.distributed:
        return value
    data = np.frombuffer(json.dumps(value).encode("utf-8"), np.uint8) if env.is_chief else np.zeros(0, np.uint8)
    length = broadcast(env, tf.constant([data.size], tf.int64), name=f"{name}_length")
    count = int(length.numpy()[0])
    buffer = data if env.is_chief else np.zeros(count, np.uint8)
    received = broadcast(env, tf.constant(buffer), name=f"{name}_bytes")
    return json.loads(bytes(received.numpy()).decode("utf-8"))


def allgather_json(env, value, name: str) -> list:
    """Every rank's JSON-serialisable ``value``, in rank order, on every rank."""
    data = np.frombuffer(json.dumps(value).encode("utf-8"), np.uint8)
    if not env.distributed:
        return [value]
    lengths = allgather(env, tf.constant([data.size], tf.int64), name=f"{name}_lengths").numpy()
    # Horovod's allgather of an empty tensor is fine, but a JSON text is never empty.
    joined = bytes(allgather(env, tf.constant(data), name=f"{name}_bytes").numpy())
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    return [json.loads(joined[bounds[r]:bounds[r + 1]].decode("utf-8")) for r in range(env.world_size)]
