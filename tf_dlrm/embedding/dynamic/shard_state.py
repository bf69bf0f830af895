"""One shard of one dynamic table: the key -> row map, row metadata, admission and eviction.

The map is a ``tf.lookup.experimental.MutableHashTable`` (int64 -> int64; any key value is valid,
no key is reserved as "empty"). Beside it, per row: ``occupied``, the ``row_key`` it holds, the
step it was ``last_used`` and its ``use_count`` since insertion.

A training step hands :meth:`ShardState.resolve` the step's distinct keys of this shard in
ascending order (the union of every rank's local batch, i.e. the global batch: the same set one
process sees). Every choice below is a function of that sorted set and the state only, never of
the arrival order, so ``N`` ranks and one process holding the same shards take the same decisions:

1. keys already mapped keep their row;
2. new keys are admitted once seen ``min_count`` times (a count table holds the others);
3. admitted keys, ascending, take free rows, ascending; when those run out, victims chosen by the
   policy among rows not used in this step (``lru``: oldest ``last_used``, ties by key; ``lfu``:
   smallest ``use_count``, then oldest, then key); keys left without a row are *rejected*: they
   read zeros this step and get no gradient (counted, never a wrong row).

With ``max_idle_steps=T``, each training step first drops the rows last used more than ``T`` steps
before it (counted as evictions): a function of each row's ``last_used`` and the step only, so it too
is the same on every number of ranks, and after a restore (``last_used`` is checkpointed).

The caller writes the new rows' initial values and resets their optimizer state (the evicted
rows' state goes with them).
"""

from __future__ import annotations

import tensorflow as tf

from tf_dlrm.sharding.dynamic_routing import EvictionPolicy


def _ordered(candidates: tf.Tensor, sort_keys) -> tf.Tensor:
    """``candidates`` sorted lexicographically by ``sort_keys`` (most significant first): stable
    sorts from the least significant key up."""
    for values in reversed(sort_keys):
        candidates = tf.gather(candidates, tf.argsort(tf.gather(values, candidates), stable=True))
    return candidates


class ShardState:
    """Args: capacity (rows of this shard), policy, min_count, name (for the variables), max_idle_steps
    (None: rows stay until evicted for room)."""

    def __init__(self, capacity: int, policy: EvictionPolicy, min_count: int, name: str,
                 max_idle_steps: int | None = None):
        self.capacity, self.policy, self.min_count = int(capacity), EvictionPolicy(policy), int(min_count)
        self.max_idle_steps = None if max_idle_steps is None else int(max_idle_steps)
        self.map = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=-1, name=f"{name}_map")
        self.seen = (tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=0, name=f"{name}_seen")
                     if self.min_count > 1 else None)
        zeros = tf.zeros([self.capacity], tf.int64)
        self.occupied = tf.Variable(tf.zeros([self.capacity], tf.bool), trainable=False, name=f"{name}_occupied")
        self.row_key = tf.Variable(zeros, trainable=False, name=f"{name}_row_key")
        self.last_used = tf.Variable(zeros, trainable=False, name=f"{name}_last_used")
        self.use_count = tf.Variable(zeros, trainable=False, name=f"{name}_use_count")
        self.size = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{name}_size")  # rows ever given out
        self.evictions = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{name}_evictions")
        self.rejections = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{name}_rejections")

    def lookup(self, keys: tf.Tensor) -> tf.Tensor:
        """Rows of ``keys`` (-1 where absent); changes nothing (evaluation)."""
        return tf.reshape(self.map.lookup(keys), [-1])

    def resolve(self, keys: tf.Tensor, counts: tf.Tensor, step: tf.Tensor):
        """Training: maps the ascending distinct ``keys`` (with their ``counts`` in this step),
        inserting and evicting as needed. Returns ``(rows [U] (-1: no row), new_rows, new_keys)``."""
        keys = tf.reshape(keys, [-1])  # the map's results have no static shape: give them one
        if self.max_idle_steps is not None:
            self._drop_idle(tf.cast(step, tf.int64))
        found = tf.reshape(self.map.lookup(keys), [-1])
        is_new = found < 0
        admitted = is_new
        if self.seen is not None:
            total = tf.reshape(self.seen.lookup(keys), [-1]) + counts
            admitted = is_new & (total >= self.min_count)
            waiting = is_new & ~admitted
            self.seen.insert(tf.boolean_mask(keys, waiting), tf.boolean_mask(total, waiting))
            self.seen.remove(tf.boolean_mask(keys, admitted))
        candidates = tf.boolean_mask(keys, admitted)  # ascending
        wanted = tf.shape(candidates, out_type=tf.int64)[0]
        if self.max_idle_steps is None:
            # No row is ever freed (an evicted row goes to a new key at once), so the occupied rows are
            # always the prefix [0, size): free rows cost O(new keys), not a scan of the capacity.
            size = self.size.read_value()
            free = tf.range(size, size + tf.minimum(wanted, self.capacity - size))
            self.size.assign(size + tf.shape(free, out_type=tf.int64)[0])
        else:  # idle rows are freed anywhere: the lowest free rows, ascending
            unoccupied = tf.reshape(tf.where(~self.occupied), [-1])
            free = unoccupied[: tf.minimum(wanted, tf.shape(unoccupied, out_type=tf.int64)[0])]
        shortfall = wanted - tf.shape(free, out_type=tf.int64)[0]
        victims = tf.zeros([0], tf.int64)
        if self.policy is not EvictionPolicy.NONE:
            # Sorting the shard's rows by age or use is paid only in steps that must evict.
            victims = tf.cond(shortfall > 0, lambda: self._evict(found, is_new, shortfall), lambda: tf.zeros([0], tf.int64))
        new_rows = tf.concat([free, victims], axis=0)
        placed = tf.shape(new_rows, out_type=tf.int64)[0]
        new_keys = candidates[:placed]
        self.rejections.assign_add(wanted - placed)
        self.map.insert(new_keys, new_rows)
        # Each admitted key's slot among the candidates; the first ``placed`` got rows.
        admitted_index = tf.cumsum(tf.cast(admitted, tf.int64), exclusive=True)
        got_row = admitted & (admitted_index < placed)
        new_row_of_key = tf.gather(tf.concat([new_rows, [-1]], 0), tf.minimum(admitted_index, placed))
        rows = tf.where(got_row, new_row_of_key, tf.where(is_new, tf.constant(-1, tf.int64), found))
        self.occupied.scatter_nd_update(new_rows[:, None], tf.ones_like(new_rows, tf.bool))
        self.row_key.scatter_nd_update(new_rows[:, None], new_keys)
        self.use_count.scatter_nd_update(new_rows[:, None], tf.zeros_like(new_rows))
        present = rows >= 0
        live_rows = tf.boolean_mask(rows, present)
        self.last_used.scatter_nd_update(live_rows[:, None], tf.fill(tf.shape(live_rows), tf.cast(step, tf.int64)))
        self.use_count.scatter_nd_add(live_rows[:, None], tf.boolean_mask(counts, present))
        return rows, new_rows, new_keys

    def _drop_idle(self, step):
        """Frees the rows last used more than ``max_idle_steps`` steps before ``step``."""
        idle = tf.reshape(tf.where(self.occupied & (step - self.last_used > self.max_idle_steps)), [-1])
        self.map.remove(tf.gather(self.row_key, idle))
        self.occupied.scatter_nd_update(idle[:, None], tf.zeros_like(idle, tf.bool))
        self.evictions.assign_add(tf.shape(idle, out_type=tf.int64)[0])

    def _evict(self, found, is_new, shortfall):
        """Up to ``shortfall`` victims among the rows not used in this step, removed from the map."""
        kept_rows = tf.boolean_mask(found, ~is_new)
        used = tf.scatter_nd(kept_rows[:, None], tf.ones_like(kept_rows, tf.bool), [self.capacity])
        evictable = tf.reshape(tf.where(self.occupied & ~used), [-1])
        if self.policy is EvictionPolicy.LRU:
            order = [self.last_used, self.row_key]
        else:
            order = [self.use_count, self.last_used, self.row_key]
        evictable = _ordered(evictable, order)
        victims = evictable[: tf.minimum(shortfall, tf.shape(evictable, out_type=tf.int64)[0])]
        self.map.remove(tf.gather(self.row_key, victims))
        self.evictions.assign_add(tf.shape(victims, out_type=tf.int64)[0])
        return victims

    # ------------------------------------------------------------------ checkpoints

    def export(self) -> dict:
        """Numpy arrays of the live rows, in row order: keys, rows, last_used, use_count; and the
        waiting keys' counts (``min_count``)."""
        rows = tf.reshape(tf.where(self.occupied), [-1])
        state = {
            "keys": tf.gather(self.row_key, rows).numpy(), "rows": rows.numpy(),
            "last_used": tf.gather(self.last_used, rows).numpy(), "use_count": tf.gather(self.use_count, rows).numpy(),
        }
        if self.seen is not None:
            keys, counts = self.seen.export()
            state["seen_keys"], state["seen_counts"] = keys.numpy(), counts.numpy()
        return state

    def load(self, keys, last_used, use_count, seen_keys=None, seen_counts=None) -> tf.Tensor:
        """Replaces the state with ``keys`` in rows ``0..n-1`` (caller orders them); returns the rows."""
        count = len(keys)
        if count > self.capacity:
            raise ValueError(f"Expected at most {self.capacity} keys for a shard of this dynamic table. Received: {count}")
        self.map.remove(self.map.export()[0])
        rows = tf.range(count, dtype=tf.int64)
        self.map.insert(tf.constant(keys, tf.int64), rows)
        self.occupied.assign(tf.range(self.capacity, dtype=tf.int64) < count)
        self.size.assign(count)
        pad = [0] * (self.capacity - count)
        self.row_key.assign(tf.constant(list(keys) + pad, tf.int64))
        self.last_used.assign(tf.constant(list(last_used) + pad, tf.int64))
        self.use_count.assign(tf.constant(list(use_count) + pad, tf.int64))
        if self.seen is not None:
            self.seen.remove(self.seen.export()[0])
            if seen_keys is not None and len(seen_keys):
                self.seen.insert(tf.constant(seen_keys, tf.int64), tf.constant(seen_counts, tf.int64))
        return rows
