"""The plan of dynamic tables, in pure Python (no TensorFlow): eviction policies, capacity scopes and key owners.

Ownership is row-wise: key ``k`` of any table belongs to shard ``mix64(k) >> 1 mod S``, with
:func:`mix64` the SplitMix64 finaliser (Steele, Lea & Flood 2014), a fixed bijection of 64-bit
words, so every rank (and the checkpoint restorer) computes the same owner without talking.
Shard ``s`` lives on rank ``s mod N``. ``S`` defaults to the world size ``N``; a single process
may hold ``S > 1`` shards, which is how the one-process reference of an ``N``-rank run with
per-shard capacity (and so per-shard eviction) is defined.
"""

from __future__ import annotations

import enum

import numpy as np

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MIX_1 = 0xBF58476D1CE4E5B9
MIX_2 = 0x94D049BB133111EB


class EvictionPolicy(str, enum.Enum):
    """What happens when a shard is full and a new key arrives in training.

    ``none``: the new key is not inserted (it reads zeros and gets no gradient; counted as rejected).
    ``lru``: the row used longest ago (ties: smallest key) makes room. ``lfu``: the row looked up
    the fewest times since its insertion (ties: least recently used, then smallest key).
    Rows looked up in the current step are never evicted by it.
    """

    NONE = "none"
    LRU = "lru"
    LFU = "lfu"


class CapacityScope(str, enum.Enum):
    """``per_rank``: every shard holds ``capacity`` rows. ``total``: the table holds ``capacity``
    rows over all shards, ``ceil(capacity / S)`` per shard (the owner of a key is fixed by its hash,
    so a shard cannot borrow another's free rows)."""

    PER_RANK = "per_rank"
    TOTAL = "total"


def shards_of_rank(rank: int, world_size: int, num_shards: int) -> tuple[int, ...]:
    """The shards rank ``rank`` holds: ``s`` with ``s mod world_size == rank``."""
    if num_shards < world_size:
        raise ValueError(f"Expected at least one dynamic shard per rank. Received: num_shards={num_shards}, "
                         f"world_size={world_size}")
    return tuple(s for s in range(num_shards) if s % world_size == rank)


def mix64(keys) -> np.ndarray:
    """SplitMix64's finaliser of ``keys + GOLDEN`` (int64 or uint64 array) as uint64."""
    z = np.asarray(keys).astype(np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        z = z + np.uint64(GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX_1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX_2)
    return z ^ (z >> np.uint64(31))


def owner_shard(keys, num_shards: int) -> np.ndarray:
    """The shard (int64) owning each int64 key."""
    return ((mix64(keys) >> np.uint64(1)).astype(np.int64) % num_shards).astype(np.int64)


def check_key_dtype(dtype, feature: str) -> None:
    """Dynamic tables take signed integer keys; any other dtype is refused by name."""
    name = np.dtype(dtype).name if not hasattr(dtype, "name") else dtype.name
    if name not in ("int32", "int64"):
        raise ValueError(f"Expected int64 (or int32) keys for dynamic feature {feature!r}. Received: dtype={name}")
