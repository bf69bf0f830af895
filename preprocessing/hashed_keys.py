"""``--keys=hashed``: raw 64-bit keys for dynamic tables instead of vocabulary ids (no counting pass).

The key of value ``v`` (a C1..C26 hash, ``0 <= v < 2**32``) of categorical feature ``f`` is
``mix64((f << 33) | v)``, and of a missing value ``mix64((f << 33) | 2**32)``, with ``mix64`` the
SplitMix64 finaliser of :mod:`tf_dlrm.sharding.dynamic_routing` (a bijection of 64-bit words): distinct
(feature, value) pairs get distinct keys, spread over the whole int64 range. No frequency threshold:
a dynamic table's capacity, eviction and ``min_count`` play that part while training.

:class:`HashedKeys` has the interface of :class:`preprocessing.vocabulary.Vocabulary` that the
engines use (``prepare``, ``lookup``), so both engines apply it in the same shared transform and
write the same bytes.
"""

from __future__ import annotations

import math
import os
from typing import Sequence

import numpy as np

from tf_dlrm.sharding.dynamic_routing import mix64

MISSING_WORD = 1 << 32
FEATURE_SHIFT = 33
TRANSFORM = "C1..C26: int64 key mix64((feature << 33) | hash), missing -> mix64((feature << 33) | 2**32); no vocabulary"


class HashedKeys:
    def prepare(self) -> "HashedKeys":
        return self

    def lookup(self, categorical: np.ndarray, dtypes: Sequence[np.dtype] | None = None) -> list[np.ndarray]:
        """``[rows, features]`` hashes (negative = missing) -> one int64 key array per feature."""
        keys = []
        for index in range(categorical.shape[1]):
            column = categorical[:, index].astype(np.int64)
            words = np.where(column < 0, MISSING_WORD, column) | np.int64(index << FEATURE_SHIFT)
            keys.append(mix64(words).view(np.int64))
        return keys


HEADROOM = 1.25  # rows per distinct training key: keys of other splits, and the uneven share of each rank
MIN_CAPACITY = 64
MAX_COUNTED = 1_000_000  # past this many distinct keys, the table is sized as that many rows per rank
CHUNK = 1 << 22  # keys read at a time


def capacity_from_keys(path: str) -> dict:
    """The dynamic-table entry (``capacity``, ``capacity_scope``) for the training keys in ``path``
    (int64): ``ceil(HEADROOM * distinct) + MIN_CAPACITY`` rows over all ranks (``total``), or, past
    ``MAX_COUNTED`` distinct keys, ``MAX_COUNTED`` rows per rank (counting stops there). A dataset of a
    few thousand rows then plans kilobytes, not gigabytes."""
    seen = np.zeros(0, np.int64)
    keys = np.memmap(path, dtype=np.int64, mode="r") if os.path.getsize(path) else np.zeros(0, np.int64)
    for start in range(0, len(keys), CHUNK):
        seen = np.union1d(seen, np.asarray(keys[start:start + CHUNK]))
        if len(seen) > MAX_COUNTED:
            return {"capacity": MAX_COUNTED, "capacity_scope": "per_rank"}
    return {"capacity": int(math.ceil(HEADROOM * len(seen))) + MIN_CAPACITY, "capacity_scope": "total"}
