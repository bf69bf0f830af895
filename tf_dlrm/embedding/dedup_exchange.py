"""The embedding exchange with duplicates removed: each owner sends each destination one row per
*distinct* id of that destination's samples, plus every sample's index into those rows.

Rank r owns entries ``e`` (a one-hot feature reading one of r's slices, ``w_e`` columns). For each
destination k and entry e, the ids of k's ``b`` samples are reduced to their distinct rows
(``tf.unique``): the values sent are ``distinct x w_e`` instead of ``b x w_e``. Two alltoalls:

- int32, equal parts: per destination ``[count of every entry, then each entry's b indices]``;
- float32 with run-time splits: per destination the distinct rows of every entry, entry by entry.

The receiver cuts both by source and entry, and ``tf.gather(rows, indices)`` rebuilds exactly the
``[b, W_s]`` block the plain exchange delivers. Backward: the gather's gradient sums the gradients of
duplicate samples into their distinct row (on the receiver, before sending), and Horovod's alltoall
gradient sends those sums back with the received splits; the owner's gather turns them into sparse
row updates. Only the bytes change: the values are those of the plain exchange, bit for bit, and the
gradients differ only by the order of the float32 sums over duplicates.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from tf_dlrm.parallel import collectives
from tf_dlrm.parallel.env import DistributedEnv


def deduplicated_exchange(env: DistributedEnv, local_batch, mine: Sequence[tuple], source_widths: Sequence[Sequence[int]],
                          name: str) -> tf.Tensor:
    """``[b, sum_s W_s]`` (float32): what every source's entries hold for this rank's samples.

    Args:
        env: this rank's place (N > 1).
        local_batch: ``b``, samples per rank (int or scalar tensor).
        mine: this rank's entries in packing order: ``(rows [N * b, width], ids [N * b] int, width)``:
            the entry's looked-up rows for the global batch (as the plain exchange would send them)
            and their ids. Each destination gets the rows of its distinct ids' first occurrences, so
            the variable's gradient keeps the plain path's layout, one entry per sample (row-wise
            optimizer state across column slices relies on it), with duplicates' gradients summed
            into the first occurrence.
        source_widths: for every rank s, the widths of its entries in packing order (each non-empty).
        name: a prefix for the two collectives.
    """
    world = env.world_size
    ints, values, value_sizes = [], [], []
    for destination in range(world):
        counts, indices, rows = [], [], []
        for looked_up, ids, width in mine:
            block = ids[destination * local_batch:(destination + 1) * local_batch]
            distinct, index = tf.unique(block, out_idx=tf.int32)
            count = tf.size(distinct, out_type=tf.int32)
            first = tf.math.unsorted_segment_min(tf.range(tf.size(block, out_type=tf.int32)), index, count)
            counts.append(count)
            indices.append(index)
            part = looked_up[destination * local_batch:(destination + 1) * local_batch]
            rows.append(tf.reshape(tf.gather(part, first), [-1]))
        ints.append(tf.concat([tf.stack(counts)] + indices, axis=0))
        part = tf.concat(rows, axis=0)
        values.append(part)
        value_sizes.append(tf.size(part, out_type=tf.int32))
    received_ints = collectives.alltoall(env, tf.concat(ints, axis=0), name=f"{name}_indices")
    received_values = collectives.alltoall(env, tf.concat(values, axis=0), tf.stack(value_sizes), name=f"{name}_rows")
    int_sizes = [len(widths) * (local_batch + 1) for widths in source_widths]
    per_source_ints = tf.split(received_ints, int_sizes, num=world)
    layouts = []
    for source, widths in enumerate(source_widths):
        entries = len(widths)
        counts = per_source_ints[source][:entries]
        indices = tf.reshape(per_source_ints[source][entries:], [entries, -1])
        sizes = counts * tf.constant(list(widths), tf.int32)
        layouts.append((counts, indices, sizes))
    per_source_values = tf.split(received_values, tf.stack([tf.reduce_sum(s) for _, _, s in layouts]), num=world)
    blocks = []
    for (counts, indices, sizes), widths, flat in zip(layouts, source_widths, per_source_values):
        pieces = tf.split(flat, sizes, num=len(widths))
        blocks.append(tf.concat([tf.gather(tf.reshape(piece, [-1, width]), indices[e])
                                 for e, (piece, width) in enumerate(zip(pieces, widths))], axis=1))
    return tf.concat(blocks, axis=1)
