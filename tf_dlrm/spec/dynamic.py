"""Dynamic tables in the feature spec (pure Python, no TensorFlow).

A categorical feature becomes a dynamic table with ``dynamic: true``::

    feature_spec:
      user_id: {dtype: int64, dynamic: true, capacity: 1000000, eviction: lru}
      item_id: {dtype: int64, dynamic: true, capacity: 4000000, capacity_scope: total, min_count: 2}

- ``dtype``: a signed integer type; the file holds raw keys (any value of the type, negative ones
  too); ``--keys=hashed`` preprocessing writes ``int64``;
- ``capacity``: rows (``capacity_scope: per_rank`` (default) or ``total``), required;
- ``eviction``: ``none`` (default: a full shard rejects new keys), ``lru`` or ``lfu``;
- ``min_count``: a key gets a row once seen that many times (default 1);
- ``max_idle_steps``: a row no training step looked up for that many steps is dropped (default: never);
- ``cardinality``: optional (the NVIDIA format requires it for fixed tables only); when absent,
  ``FeatureSpec.cardinalities()`` reports the capacity (the table's rows, for memory estimates).
"""

from __future__ import annotations

from typing import Any, Mapping

from tf_dlrm.sharding.dynamic_routing import CapacityScope, EvictionPolicy

KEYS = ("dynamic", "capacity", "capacity_scope", "eviction", "min_count", "max_idle_steps")
KEY_DTYPES = ("int8", "int16", "int32", "int64")


def is_dynamic(properties: Mapping[str, Any]) -> bool:
    return properties.get("dynamic") is True


def problem(name: str, properties: Mapping[str, Any]) -> str | None:
    """What is wrong with a feature's dynamic-table keys (a ``.key: message``), or None."""
    dynamic = properties.get("dynamic", False)
    if not isinstance(dynamic, bool):
        return f".dynamic: expected true or false. Received: {dynamic!r}"
    if not dynamic:
        stray = [k for k in KEYS[1:] if k in properties]
        return f": {stray} only apply to dynamic tables (add dynamic: true)" if stray else None
    dtype = properties.get("dtype")
    if dtype not in KEY_DTYPES:
        return f".dtype: dynamic feature '{name}' needs a signed integer dtype {list(KEY_DTYPES)}. Received: {dtype!r}"
    capacity = properties.get("capacity")
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
        return f".capacity: dynamic feature '{name}' needs a positive integer capacity. Received: {capacity!r}"
    if properties.get("eviction", "none") not in [p.value for p in EvictionPolicy]:
        return f".eviction: expected one of {[p.value for p in EvictionPolicy]}. Received: {properties.get('eviction')!r}"
    if properties.get("capacity_scope", "per_rank") not in [s.value for s in CapacityScope]:
        return (f".capacity_scope: expected one of {[s.value for s in CapacityScope]}. "
                f"Received: {properties.get('capacity_scope')!r}")
    min_count = properties.get("min_count", 1)
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count <= 0:
        return f".min_count: expected a positive integer. Received: {min_count!r}"
    idle = properties.get("max_idle_steps")
    if idle is not None and (isinstance(idle, bool) or not isinstance(idle, int) or idle <= 0):
        return f".max_idle_steps: expected a positive integer (or no key: rows never expire). Received: {idle!r}"
    return None


def dynamic_features(spec) -> list[str]:
    """The spec's categorical features with ``dynamic: true``, in channel order."""
    return [n for n in spec.categorical_features if is_dynamic(spec.feature_spec[n])]
