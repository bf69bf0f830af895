"""Crossed features of Wide & Deep, declared in the feature spec; pure Python (no TensorFlow).

A feature spec may carry an optional top-level list::

    crossed_features:
      - {features: [cat_0.bin, cat_1.bin], buckets: 10000}
      - {features: [cat_2.bin, cat_5.bin], buckets: 5000, name: device_x_site}

Each entry crosses two one-hot categorical features: the pair of ids ``(a, b)`` becomes one id in
``[0, buckets)`` (:func:`crossed_bucket`), which reads its own width-1 table of ``buckets`` rows in
the wide part. ``name`` defaults to ``cross:<first>*<second>``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

# A Lehmer (MINSTD) step over the exact pair index scrambles neighbouring pairs into far buckets.
# Every product stays below 2^62, so int64 arithmetic in TensorFlow and numpy agree bit for bit.
MODULUS = 2147483647
MULTIPLIER = 48271


@dataclasses.dataclass(frozen=True)
class CrossedFeature:
    """Two categorical features hashed together into ``buckets`` ids."""

    first: str
    second: str
    buckets: int
    name: str = ""

    def __post_init__(self):
        if isinstance(self.buckets, bool) or not isinstance(self.buckets, int) or not 1 <= self.buckets < 2**31:
            raise ValueError(f"Expected buckets to be an integer in [1, 2^31) for crossed feature {self.first}*{self.second}. "
                             f"Received: buckets={self.buckets!r}")
        if self.first == self.second:
            raise ValueError(f"Expected two different features in a crossed feature. Received: {self.first} twice")
        if not self.name:
            object.__setattr__(self, "name", f"cross:{self.first}*{self.second}")

    def to_dict(self) -> dict:
        return {"features": [self.first, self.second], "buckets": self.buckets, "name": self.name}


def crossed_bucket(first: int, second: int, second_cardinality: int, buckets: int) -> int:
    """The bucket of the id pair: ``((first * card2 + second) mod M) * A mod M mod buckets``."""
    pair = (first * second_cardinality + second) % MODULUS
    return (pair * MULTIPLIER) % MODULUS % buckets


def parse_crossed_features(entries, categorical: Sequence[str], hotness: Mapping[str, int], source: str = "feature spec") -> tuple[CrossedFeature, ...]:
    """Checks the spec's ``crossed_features`` list; raises ValueError naming the entry and key."""
    if entries is None:
        return ()
    if not isinstance(entries, (list, tuple)):
        raise ValueError(f"{source}: crossed_features must be a list of {{features: [a, b], buckets: N}}. Received: {entries!r}")
    crossed, names = [], set()
    for index, entry in enumerate(entries):
        where = f"{source}: crossed_features[{index}]"
        if not isinstance(entry, Mapping) or set(entry) - {"features", "buckets", "name"}:
            raise ValueError(f"{where}: expected keys features, buckets (and optional name). Received: {entry!r}")
        features = entry.get("features")
        if not isinstance(features, (list, tuple)) or len(features) != 2:
            raise ValueError(f"{where}.features: expected two categorical feature names. Received: {features!r}")
        for name in features:
            if name not in categorical:
                raise ValueError(f"{where}.features: {name!r} is not a categorical feature of the spec")
            if hotness.get(name, 1) != 1:
                raise ValueError(f"{where}.features: {name!r} is multi-hot (hotness {hotness[name]}); only one-hot features cross")
        try:
            feature = CrossedFeature(features[0], features[1], entry.get("buckets"), entry.get("name") or "")
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None
        if feature.name in names or feature.name in categorical:
            raise ValueError(f"{where}: the name {feature.name!r} is used twice")
        names.add(feature.name)
        crossed.append(feature)
    return tuple(crossed)
