"""Hot-row replication, executed: hot ids looked up locally, only cold rows through the alltoall.

The hottest rows of a model-parallel table (chosen by :mod:`tf_dlrm.sharding.hot_rows`) are held
whole (every column) by every rank in a ``hot`` variable (``[hot rows, D]``, slot ``k`` = the
``k``-th smallest hot id). Those replicas, not the owner's copies, are the model's values of the hot
rows: the owner's rows of hot ids are never read (checkpoints overlay the replicas,
:mod:`tf_dlrm.embedding.full_tables`).

Forward, per (owner, destination, entry) with ``b`` samples of the destination (one-hot features):

- the owner, which looks up the global batch of its entries anyway, marks each sample's id with its
  hot slot (or ``-1`` when cold) and sends the ``b`` codes (int32, one alltoall for all entries),
  then only the **cold** samples' rows (float, one alltoall with run-time splits);
- the owner of a row band marks the ids outside its band ``-2`` (:data:`OUTSIDE`): another band
  holds them, hot or cold, so nothing is sent for them and the receiver puts zeros in their place
  (the bands' blocks are added up);
- the receiver rebuilds the plain ``[b, w]`` block: hot samples from its own replica (the entry's
  columns of the full hot row), cold samples from the received rows, in sample order
  (``tf.dynamic_stitch``).

Backward: the cold rows' gradients return through the alltoall to the owner's rows; the hot rows'
gradients land on this rank's replica as ``IndexedSlices`` of its own hot samples only.
:func:`combine_hot_gradient` makes them the same on every rank without a dense allreduce: each rank
sums its gradient per touched hot slot, the ranks allgather those (slots, rows), and every rank sums
the gathered rows per slot in the same order. The sum over ranks is ``N`` times the gradient of the
global mean loss, like a shard's; the sparse updater scales it by ``1/N`` and applies the embedding
optimizer to the touched slots with the replica's own (replicated) optimizer state, so every rank
updates identical rows identically and the model equals the one without replication. With
``--hot_row_sync_every=S > 1`` the trainer skips this combine: each rank updates its replica with its
own gradient and the ranks merge every ``S`` steps (:mod:`tf_dlrm.embedding.hot_row_sync`).
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from tf_dlrm.parallel import collectives
from tf_dlrm.parallel.env import DistributedEnv
from tf_dlrm.optimizers.sparse_optimizer import deduplicate


COLD = -1
OUTSIDE = -2  # an id of another row band: neither sent nor read from the replica here


def hot_codes(ids: tf.Tensor, hot_ids: tf.Tensor | None, band: tuple[int, int] | None = None) -> tf.Tensor:
    """int32 hot slot of each id (its position in the sorted ``hot_ids``; None: no hot rows), :data:`COLD` for
    cold ids, :data:`OUTSIDE` for ids outside ``band`` (``[row_start, row_end)`` of a row band; None: every row)."""
    ids = tf.cast(ids, tf.int64)
    if hot_ids is None:
        codes = tf.fill(tf.shape(ids), tf.constant(COLD, tf.int32))
    else:
        slots = tf.searchsorted(hot_ids, ids, side="left", out_type=tf.int32)
        found = tf.gather(tf.concat([hot_ids, tf.constant([-1], tf.int64)], axis=0), slots)
        codes = tf.where(tf.equal(found, ids), slots, tf.fill(tf.shape(slots), tf.constant(COLD, tf.int32)))
    if band is None:
        return codes
    inside = tf.logical_and(ids >= band[0], ids < band[1])
    return tf.where(inside, codes, tf.fill(tf.shape(codes), tf.constant(OUTSIDE, tf.int32)))


def _pieces(tensor: tf.Tensor, sizes) -> list[tf.Tensor]:
    """``tensor`` cut into consecutive pieces of ``sizes`` (scalar tensors). Plain slices: tracing a
    ``tf.split`` with these run-time sizes hung in SplitV's shape function on a rank owning nothing."""
    sizes = tf.stack([tf.cast(s, tf.int32) for s in sizes])
    ends = tf.cumsum(sizes)
    starts = ends - sizes
    return [tensor[starts[i]:ends[i]] for i in range(int(sizes.shape[0]))]


def hot_row_exchange(env: DistributedEnv, local_batch, mine: Sequence[tuple], sources: Sequence[Sequence[tuple]],
                     name: str, padding=None) -> tf.Tensor:
    """``[b, sum_s W_s]``: every source's entries for this rank's samples, as the plain exchange gives.

    Args:
        env: this rank's place (N > 1).
        local_batch: ``b``, samples per rank.
        mine: this rank's entries in packing order: ``(rows [N * b, w], codes [N * b] int32)``, the
            looked-up rows of the global batch and each sample's hot slot (``-1``: cold).
        sources: for every rank s, its entries in packing order: ``(hot rows [H, D] or None,
            column_start, column_end, banded)``; ``None`` for a table without hot rows (every sample cold);
            ``banded``: the slice is a row band (its codes may be :data:`OUTSIDE`).
        name: a prefix for the two collectives.
        padding: on a rank owning no slice, a ``[1, 1]`` read of its padding variable, sent as the
            padding value so that its backward alltoall stays in the graph (as in the plain exchange).
            The receivers' block keeps the plain exchange's zero column for such a source.
    """
    world = env.world_size
    codes_out, values_out, value_sizes = [], [], []
    for destination in range(world):
        part = slice(destination * local_batch, (destination + 1) * local_batch)
        rows = []
        for looked_up, codes in mine:
            block_codes = codes[part]
            codes_out.append(block_codes)
            rows.append(tf.reshape(tf.boolean_mask(looked_up[part], tf.equal(block_codes, COLD)), [-1]))
        # One padding value per destination: every cold row may be hot this step, and Horovod's
        # alltoall hangs on an empty send.
        pad = tf.reshape(tf.cast(padding, tf.float32), [1]) if padding is not None else tf.zeros([1], tf.float32)
        values = tf.concat(rows + [pad], axis=0)
        values_out.append(values)
        value_sizes.append(tf.size(values, out_type=tf.int32))
    if not mine:
        # Horovod's alltoall hangs on an empty send: one code nobody reads. Read from the padding
        # variable, not a constant: shape inference evaluates constant inputs, and would run this
        # rank's alltoall alone while tracing (a hang).
        code = tf.zeros([1], tf.int32) if padding is None else tf.cast(tf.reshape(tf.cast(padding, tf.float32), [1]) * 0, tf.int32)
        codes_out = [code] * world
    sent_codes = tf.concat(codes_out, axis=0)
    received_codes = collectives.alltoall(env, sent_codes, name=f"{name}_codes")
    sent_values = tf.concat(values_out, axis=0)
    received_values = collectives.alltoall(env, sent_values, tf.stack(value_sizes), name=f"{name}_rows")
    per_source_codes = _pieces(received_codes, [len(entries) * local_batch if entries else 1 for entries in sources])
    cold_sizes, layouts = [], []
    for codes, entries in zip(per_source_codes, sources):
        if not entries:
            layouts.append([])
            cold_sizes.append(tf.constant(1, tf.int32))
            continue
        codes = tf.reshape(codes, [len(entries), -1])
        sizes = [tf.reduce_sum(tf.cast(tf.equal(codes[e], COLD), tf.int32)) * (end - start)
                 for e, (_, start, end, *_) in enumerate(entries)]
        layouts.append((codes, sizes))
        cold_sizes.append(tf.add_n(sizes) + 1)
    per_source_values = _pieces(received_values, cold_sizes)
    blocks = []
    for layout, entries, flat in zip(layouts, sources, per_source_values):
        if not entries:  # the plain exchange's padding column of a source owning nothing
            blocks.append(tf.zeros([local_batch, 1], tf.float32) * flat[:1])
            continue
        codes, sizes = layout
        pieces = _pieces(flat[:-1], sizes)
        for e, ((hot, start, end, *band), piece) in enumerate(zip(entries, pieces)):
            banded = bool(band and band[0])
            cold_rows = tf.reshape(piece, [-1, end - start])
            if hot is None and not banded:
                blocks.append(cold_rows)
                continue
            cold_position = tf.cast(tf.where(tf.equal(codes[e], COLD))[:, 0], tf.int32)
            outside = tf.cast(tf.where(tf.equal(codes[e], OUTSIDE))[:, 0], tf.int32)
            positions, parts = [cold_position, outside], [cold_rows, tf.zeros([tf.size(outside), end - start], cold_rows.dtype)]
            if hot is not None:
                hot_position = tf.cast(tf.where(codes[e] >= 0)[:, 0], tf.int32)
                positions.append(hot_position)
                parts.append(tf.gather(hot, tf.gather(codes[e], hot_position))[:, start:end])
            blocks.append(tf.dynamic_stitch(positions, parts))
    width = sum(sum(end - start for _, start, end, *_ in entries) if entries else 1 for entries in sources)
    return tf.reshape(tf.concat(blocks, axis=1), [-1, width])  # a static width for the permutation


def combine_hot_gradient(env: DistributedEnv, gradient, hot_rows: int, name: str) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """``(slots, summed rows, rows this rank sent)`` of a hot replica's gradient summed over ranks,
    identical on every rank.

    ``gradient``: this rank's gradient of the replica (``IndexedSlices`` or dense ``[H, D]``).
    """
    if not isinstance(gradient, tf.IndexedSlices):
        gradient = tf.IndexedSlices(gradient, tf.range(hot_rows), None)
    slots, summed, _ = deduplicate(tf.IndexedSlices(gradient.values, tf.cast(gradient.indices, tf.int32), None))
    if not env.distributed:
        return slots, summed, tf.constant(0, tf.int32)
    # One sentinel row per rank (slot H, zeros): no rank ever sends an empty tensor.
    slots = tf.concat([tf.cast(slots, tf.int32), tf.constant([hot_rows], tf.int32)], axis=0)
    sent = tf.size(slots, out_type=tf.int32)
    summed = tf.concat([summed, tf.zeros([1, tf.shape(summed)[1]], summed.dtype)], axis=0)
    all_slots = collectives.allgather(env, slots, name=f"{name}_slots")
    all_rows = collectives.allgather(env, summed, name=f"{name}_rows")
    slots, summed, _ = deduplicate(tf.IndexedSlices(all_rows, all_slots, None))
    keep = tf.where(slots < hot_rows)[:, 0]
    return tf.gather(slots, keep), tf.gather(summed, keep), sent
