"""``--data_parallel_input``: every rank reads its local batch of every feature; alltoalls of ids give
each rank the global batch of the features whose tables it owns.

- One-hot features: one alltoall of ``[b, features of the destination]`` blocks (sizes known).
- Multi-hot features (fixed or ragged, both as ``tf.RaggedTensor``): one alltoall of the row
  lengths (sizes known), then one of the ids themselves, whose sizes are the sums of those lengths
  and so known only when run. Each destination's ids carry one extra padding id, because Horovod's
  alltoall hangs when a rank sends nothing; the receiver drops it.
- Weighted features (always multi-hot here): one more alltoall carries their weights, laid out as their
  ids are (one padding weight per destination), so the owner pools the global batch with its weights.

The receiver gets, from each source rank in rank order, that rank's local rows: joining the sources
feature by feature gives the global batch in global order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import tensorflow as tf

from tf_dlrm.parallel import collectives
from tf_dlrm.parallel.env import DistributedEnv


def exchange_ids(env: DistributedEnv, local_ids: Mapping[int, object], features_on_rank: Sequence[Sequence[int]],
                 mine: int, name: str, local_weights: Mapping[int, tf.Tensor] | None = None) -> tuple[dict, dict, list]:
    """Returns ``({feature: global ids}, {feature: global weights}, unread)`` for the features rank ``mine`` owns.

    Args:
        local_ids: this rank's local batch of every feature: 1-D tensors or RaggedTensors.
        local_weights: this rank's weights of the weighted features (RaggedTensors in ``local_ids``), as
            float32 values aligned with their ids' values; the same features on every rank.
        features_on_rank: per rank, the features it owns (the same list on every rank).
        mine: this rank.
        name: prefix of the collectives' names (the same on every rank).

    ``unread`` holds received tensors this rank does not use; the caller must consume them, or
    TensorFlow prunes this rank's alltoall and the other ranks wait for it forever.
    """
    world = env.world_size
    one_hot = [[f for f in features if not isinstance(local_ids[f], tf.RaggedTensor)] for features in features_on_rank]
    multi_hot = [[f for f in features if isinstance(local_ids[f], tf.RaggedTensor)] for features in features_on_rank]
    local_weights = dict(local_weights or {})
    result, weights, unread = {}, {}, []
    if any(one_hot):
        received = _exchange_one_hot(env, local_ids, one_hot, f"{name}_ids")
        owned = len(one_hot[mine])
        if owned:
            columns = tf.reshape(received, [-1, owned])
            result.update({f: columns[:, j] for j, f in enumerate(one_hot[mine])})
        else:
            unread.append(received)
    if any(multi_hot):
        ragged, received_weights, extra = _exchange_multi_hot(env, local_ids, multi_hot, mine, world, name, local_weights)
        result.update(ragged)
        weights.update(received_weights)
        unread.extend(extra)
    return result, weights, unread


def _received(env, flat, splits, name):
    """The alltoall, its result hidden from constant folding: when a layer is first called on
    constant ids, TensorFlow's shape inference would otherwise run the (stateful, collective)
    alltoall on its own to learn a shape downstream, on one rank only, and wait forever."""
    received = collectives.alltoall(env, flat, splits, name=name)
    return tf.raw_ops.PlaceholderWithDefault(input=received, shape=[None])


def _exchange_one_hot(env, local_ids, per_rank, name):
    sends, splits = [], []
    any_ids = next(iter(local_ids[f] for features in per_rank for f in features))
    local_batch = any_ids.shape[0]
    for features in per_rank:
        splits.append(len(features) * (local_batch if local_batch is not None else 0))
        if features:
            sends.append(tf.reshape(tf.stack([local_ids[f] for f in features], axis=1), [-1]))
    flat = tf.concat(sends, axis=0)
    if local_batch is None:
        # Unknown at trace time: the sizes are computed when run.
        rows = tf.shape(any_ids)[0]
        splits = tf.stack([rows * len(features) for features in per_rank])
    return _received(env, flat, splits, name)


def _exchange_multi_hot(env, local_ids, per_rank, mine, world, name, local_weights):
    """Row lengths, then ids (one padding id per destination), then the weighted features' weights;
    returns ({feature: ragged}, {feature: weights}, unread)."""
    all_features = [f for features in per_rank for f in features]
    rows = local_ids[all_features[0]].nrows(out_type=tf.int32)
    # One id dtype on the wire: int64 if any feature needs it.
    dtype = tf.int64 if any(local_ids[f].values.dtype == tf.int64 for f in all_features) else tf.int32
    lengths, values, value_splits, length_splits = [], [], [], []
    for features in per_rank:
        ragged = [local_ids[f] for f in features]
        if ragged:
            lengths.append(tf.reshape(tf.stack([tf.cast(r.row_lengths(), tf.int32) for r in ragged], axis=1), [-1]))
        length_splits.append(len(features))
        sent = tf.concat([tf.cast(r.values, dtype) for r in ragged] + [tf.zeros([1], dtype)], axis=0)
        values.append(sent)
        value_splits.append(tf.shape(sent, out_type=tf.int32)[0])
    length_splits = tf.stack([rows * n for n in length_splits])
    received_lengths = _received(env, tf.concat(lengths, axis=0), length_splits, f"{name}_lengths")
    received_values = _received(env, tf.concat(values, axis=0), tf.stack(value_splits), f"{name}_values")
    received_weights = None
    if local_weights:
        sent_weights, weight_splits = [], []
        for features in per_rank:
            sent = tf.concat([local_weights[f] for f in features if f in local_weights] + [tf.zeros([1], tf.float32)], axis=0)
            sent_weights.append(sent)
            weight_splits.append(tf.shape(sent, out_type=tf.int32)[0])
        received_weights = _received(env, tf.concat(sent_weights, axis=0), tf.stack(weight_splits), f"{name}_weights")
    owned = per_rank[mine]
    if not owned:
        return {}, {}, [received_lengths, received_values] + ([received_weights] if local_weights else [])
    count = len(owned)
    # From source s: [b, count] lengths, then per feature its ids, then one padding id.
    per_sample = tf.reshape(received_lengths, [world, -1, count])
    per_source = tf.reduce_sum(per_sample, axis=1)  # [world, count] ids per (source, feature)
    sizes = tf.reshape(tf.concat([per_source, tf.ones([world, 1], tf.int32)], axis=1), [-1])
    pieces = tf.split(received_values, sizes, num=world * (count + 1))
    result = {}
    global_lengths = tf.reshape(per_sample, [-1, count])
    for j, feature in enumerate(owned):
        ids = tf.concat([pieces[s * (count + 1) + j] for s in range(world)], axis=0)
        result[feature] = tf.RaggedTensor.from_row_lengths(ids, global_lengths[:, j], validate=False)
    weights, unread = {}, []
    if local_weights:
        weighted = [j for j, feature in enumerate(owned) if feature in local_weights]
        if weighted:
            # From source s: its ids' count of each weighted feature, then one padding weight.
            counts = tf.concat([tf.gather(per_source, weighted, axis=1), tf.ones([world, 1], tf.int32)], axis=1)
            parts = tf.split(received_weights, tf.reshape(counts, [-1]), num=world * (len(weighted) + 1))
            for k, j in enumerate(weighted):
                weights[owned[j]] = tf.concat([parts[s * (len(weighted) + 1) + k] for s in range(world)], axis=0)
        else:
            unread.append(received_weights)
    return result, weights, unread
