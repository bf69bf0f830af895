"""``--hot_row_sync_every=S``: hot-row replicas that drift for at most ``S`` steps (bounded staleness).

With ``S = 1`` (the default) the trainer combines the hot rows' gradients over ranks every step
(:func:`tf_dlrm.embedding.hot_row_exchange.combine_hot_gradient`) and the replicas never differ.
With ``S > 1`` (HET's idea, VLDB 2022, with one clock for the whole cache instead of one per row):

- **local steps**: each rank applies the embedding optimizer to its own replica with its *own*
  gradient of the hot rows (summed per touched slot, scaled by ``1/N`` like the combined one, so that
  the sum over ranks of one step's updates is exactly the synchronous SGD update) and remembers which
  slots it touched. Nothing about hot rows travels.
- **merge** (collective), every ``S``-th step, and before anything reads the tables (evaluation,
  a checkpoint, the end of training, :meth:`HotRowSync.synchronize`): every rank sends the rows it
  touched since the last merge (deduplicated: one row per touched slot) as
  ``delta = replica - base``, where ``base`` is the replica as it was after the last merge (identical
  on every rank); all ranks allgather them and set each touched row to
  ``base + sum over ranks of delta`` (summed in rank order, the same float32 additions everywhere),
  which becomes the new ``base``. So after a merge every replica is bit-identical, and a replica
  never runs more than ``S`` steps ahead of the others' updates.

  SGD: the merged row is ``base - lr / N * sum over steps and ranks of g`` (each rank's gradients at
  its own stale replica); with ``S = 1`` that is exactly the synchronous update (up to the order of the
  float32 sums). Stateful optimizers: **their state is merged the same way**: each state variable of
  the replica (Adagrad's and FTRL's accumulators, FTRL's linear term, lazy Adam's ``m`` and ``v``,
  row-wise Adagrad's one value per row) moves by the sum of what every rank's local steps moved it
  by. A row touched by one rank only in the window therefore ends with exactly that rank's row and
  state; additive state (accumulators) keeps every rank's contribution; for the moving averages of
  lazy Adam the decay of a row touched by ``k`` ranks is counted ``k`` times (``m`` merges to
  ``(1 - k (1 - beta1)) m + (1 - beta1) sum_r g_r``), so Adam's state is not the synchronous one even
  at ``S = 1``, only SGD's rows are; from ``k (1 - beta1) >= 1`` (10 ranks at beta1 = 0.9) the old
  momentum of a row every rank touched is cancelled or flipped.

Memory: a copy (``base``) of every replica and its state, and one int32 flag per hot row.
Bytes: per merge, each rank sends its touched rows' deltas (row width + state widths) and an int32
slot each to the ``N - 1`` others, once per ``S`` steps instead of its gradient rows every step.
"""

from __future__ import annotations

import tensorflow as tf

from tf_dlrm.parallel import collectives
from tf_dlrm.parallel.env import DistributedEnv
from tf_dlrm.optimizers.sparse_optimizer import deduplicate, tf_variable


class HotRowSync:
    """The local steps and merges of hot-row replicas (see the module docstring).

    Args:
        env: this rank's place (N > 1).
        every: ``S``, merge every this many steps (>= 1; 1 merges after every step, which with SGD is
            the synchronous combine up to summation order: the trainer uses the exact combine then).
        replicas: the ``hot`` variables ``[H, D]``.
        states: for each replica, its optimizer state variables (``[H, w]``), in the same order on
            every rank.
        bytes_sent: an int64 variable counting the bytes this rank sends (added to at each merge).
    """

    def __init__(self, env: DistributedEnv, every: int, replicas, states, bytes_sent: tf.Variable):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"Expected --hot_row_sync_every >= 1 (an integer). Received: --hot_row_sync_every={every!r}")
        self.env, self.every = env, every
        self.replicas = list(replicas)
        self.states = [list(s) for s in states]
        if len(self.states) != len(self.replicas):
            raise ValueError(f"Expected one list of state variables per replica. Received: {len(self.states)} for "
                             f"{len(self.replicas)} replicas")
        self.bytes_sent = bytes_sent
        # What every rank agreed on at the last merge: the replica and its state, per replica.
        self.bases = [[tf.Variable(tf_variable(v).read_value(), trainable=False, name=f"hot_sync_base_{i}_{k}")
                       for k, v in enumerate(self._parts(i))] for i in range(len(self.replicas))]
        self.touched = [tf.Variable(tf.zeros([int(v.shape[0])], tf.int32), trainable=False, name=f"hot_sync_touched_{i}")
                        for i, v in enumerate(self.replicas)]
        self.steps_since_merge = tf.Variable(0, dtype=tf.int64, trainable=False, name="hot_sync_steps_since_merge")
        self.merges = tf.Variable(0, dtype=tf.int64, trainable=False, name="hot_sync_merges")
        self._merge_function = tf.function(self._merge_all, autograph=False)

    def _parts(self, index: int) -> list:
        """The replica ``index`` and its state variables: what a merge combines."""
        return [self.replicas[index]] + self.states[index]

    @property
    def variables(self) -> list:
        return [b for bases in self.bases for b in bases] + self.touched + [self.steps_since_merge, self.merges]

    # ------------------------------------------------------------------ local steps

    def local_gradient(self, index: int, gradient) -> tuple[tf.Tensor, tf.Tensor]:
        """``(slots, summed rows)`` of this rank's own gradient of replica ``index``, touched slots marked.

        The updater scales it by ``1/N`` like the combined gradient (:class:`SparseUpdater.apply`).
        """
        rows = int(self.replicas[index].shape[0])
        if not isinstance(gradient, tf.IndexedSlices):
            gradient = tf.IndexedSlices(gradient, tf.range(rows), None)
        slots, summed, _ = deduplicate(tf.IndexedSlices(gradient.values, tf.cast(gradient.indices, tf.int32), None))
        self.touched[index].scatter_update(tf.IndexedSlices(tf.ones_like(slots), slots))
        return slots, summed

    def after_step(self) -> None:
        """In the training step, after the update: counts the step and merges every ``S``-th one.
        Every rank counts the same steps, so every rank takes the same branch of the ``tf.cond``."""
        count = self.steps_since_merge.assign_add(1)

        def merge():
            self._merge_all()
            return tf.constant(True)

        tf.cond(count >= self.every, merge, lambda: tf.constant(False))

    # ------------------------------------------------------------------ merges

    def synchronize(self) -> bool:
        """Collective: merges now when any step ran since the last merge (the same answer on every
        rank: they run the same steps); returns whether it merged. Call before reading the tables."""
        if int(self.steps_since_merge.numpy()) == 0:
            return False
        self._merge_function()
        return True

    def rebase(self) -> None:
        """After the replicas or their state were written from outside (a checkpoint restored, a kept
        state put back), identically on every rank: they are the new agreed base, nothing is pending."""
        for index, bases in enumerate(self.bases):
            for base, part in zip(bases, self._parts(index)):
                base.assign(tf_variable(part).read_value())
            self.touched[index].assign(tf.zeros_like(self.touched[index]))
        self.steps_since_merge.assign(0)

    def _merge_all(self) -> None:
        sent = [self._merge(index) for index in range(len(self.replicas))]
        if sent:
            self.bytes_sent.assign_add(tf.add_n(sent))
        self.steps_since_merge.assign(0)
        self.merges.assign_add(1)

    def _merge(self, index: int) -> tf.Tensor:
        """Merges replica ``index`` (collective); returns the bytes this rank sent."""
        parts = self._parts(index)
        bases = self.bases[index]
        rows = int(self.replicas[index].shape[0])
        slots = tf.cast(tf.where(self.touched[index] > 0)[:, 0], tf.int32)
        deltas = tf.concat([tf.gather(tf_variable(p), slots) - tf.gather(b, slots) for p, b in zip(parts, bases)], axis=1)
        width = int(deltas.shape[1])
        # One sentinel row per rank (slot H, zeros): no rank ever sends an empty tensor.
        slots = tf.concat([slots, tf.constant([rows], tf.int32)], axis=0)
        deltas = tf.concat([deltas, tf.zeros([1, width], deltas.dtype)], axis=0)
        all_slots = collectives.allgather(self.env, slots, name=f"hot_sync_slots_{index}")
        all_deltas = collectives.allgather(self.env, deltas, name=f"hot_sync_deltas_{index}")
        # The same input on every rank, summed in the same (rank) order: the same result everywhere.
        unique, summed, _ = deduplicate(tf.IndexedSlices(all_deltas, all_slots, None))
        keep = tf.where(unique < rows)[:, 0]
        unique, summed = tf.gather(unique, keep), tf.gather(summed, keep)
        start = 0
        for part, base in zip(parts, bases):
            part_width = int(base.shape[1])
            merged = tf.gather(base, unique) + summed[:, start:start + part_width]
            start += part_width
            tf_variable(part).scatter_update(tf.IndexedSlices(merged, unique))
            base.scatter_update(tf.IndexedSlices(merged, unique))
        self.touched[index].assign(tf.zeros_like(self.touched[index]))
        sent = tf.cast(tf.size(slots), tf.int64)
        return sent * (width * 4 + 4) * (self.env.world_size - 1)
