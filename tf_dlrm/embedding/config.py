"""Table and feature configs of the embedding library: plain frozen data, no TensorFlow.

A *table* is a ``[rows, width]`` matrix of trainable vectors; a *feature* is one input of ids that
reads one table and pools the vectors of a sample's ids into one vector (``sum``, ``mean`` or
``sqrtn``). Several features may share a table (a user's clicked items and the candidate item).
The split follows keras-rs and TF's TPU embedding API (``TableConfig`` / ``FeatureConfig``).

Ids of a feature arrive as one of:

- a dense ``[batch]`` tensor: one id per sample (``hotness == 1``);
- a dense ``[batch, hotness]`` tensor: exactly ``hotness`` ids per sample (fixed hotness);
- a ``tf.RaggedTensor`` ``[batch, None]`` (``ragged=True``): at most ``hotness`` ids per sample.
  An empty row pools to a zero vector under every combiner (its gradient is zero too).

There is no pad id: every id must lie in ``[0, rows)``; an id outside it is an error naming the
feature, never a silent read of a neighbouring table's row.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence


class Combiner(str, enum.Enum):
    """How the vectors of one sample's ids become one vector.

    ``sum``: their sum; ``mean``: sum / count; ``sqrtn``: sum / sqrt(count) (TF's
    ``safe_embedding_lookup_sparse`` names); an empty sample gives zeros.
    """

    SUM = "sum"
    MEAN = "mean"
    SQRTN = "sqrtn"


INITIALIZERS = ("uniform_sqrt_rows",)
OPTIMIZERS = ("sgd",)


def _check_positive_int(owner: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Expected {name} to be a positive integer for {owner}. Received: {name}={value!r}")


def _check_name(kind: str, name) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"Expected a non-empty {kind} name. Received: name={name!r}")


@dataclasses.dataclass(frozen=True)
class TableConfig:
    """One embedding table.

    Attributes:
        name: unique table name.
        rows: number of ids (the cardinality).
        width: length of each vector (the embedding dim of this table).
        initializer: ``uniform_sqrt_rows``: uniform in ``[-1/sqrt(rows), 1/sqrt(rows)]`` from
            ``(seed, table index)`` only, so every sharding starts from the same values.
        optimizer: ``sgd`` (sparse SGD on the touched rows).
    """

    name: str
    rows: int
    width: int
    initializer: str = "uniform_sqrt_rows"
    optimizer: str = "sgd"

    def __post_init__(self):
        _check_name("table", self.name)
        _check_positive_int(f"table {self.name!r}", "rows", self.rows)
        _check_positive_int(f"table {self.name!r}", "width", self.width)
        if self.initializer not in INITIALIZERS:
            raise ValueError(f"Expected initializer in {INITIALIZERS} for table {self.name!r}. "
                             f"Received: initializer={self.initializer!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"Expected optimizer in {OPTIMIZERS} for table {self.name!r}. "
                             f"Received: optimizer={self.optimizer!r}")


@dataclasses.dataclass(frozen=True)
class FeatureConfig:
    """One input feature: which table it reads and how a sample's ids are pooled.

    Attributes:
        name: unique feature name (the key of the id and output dicts).
        table: the name of the table it reads.
        hotness: ids per sample (fixed), or the most ids a sample may have (``ragged``).
        combiner: a :class:`Combiner` value.
        ragged: ids come as a ``tf.RaggedTensor`` with a variable count per sample.
    """

    name: str
    table: str
    hotness: int = 1
    combiner: str = Combiner.SUM.value
    ragged: bool = False

    def __post_init__(self):
        _check_name("feature", self.name)
        _check_name("table", self.table)
        _check_positive_int(f"feature {self.name!r}", "hotness", self.hotness)
        try:
            object.__setattr__(self, "combiner", Combiner(self.combiner).value)
        except ValueError:
            allowed = [c.value for c in Combiner]
            raise ValueError(f"Expected combiner in {allowed} for feature {self.name!r}. "
                             f"Received: combiner={self.combiner!r}") from None
        object.__setattr__(self, "ragged", bool(self.ragged))

    @property
    def one_hot(self) -> bool:
        """One id per sample, given as a ``[batch]`` tensor: no pooling at all."""
        return self.hotness == 1 and not self.ragged

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def as_feature_config(value) -> FeatureConfig:
    return value if isinstance(value, FeatureConfig) else FeatureConfig(**dict(value))


def feature_tables(features: Sequence[FeatureConfig], table_names: Sequence[str]) -> tuple[int, ...]:
    """The table index of every feature; raises naming a feature whose table does not exist."""
    index = {name: i for i, name in enumerate(table_names)}
    seen = set()
    result = []
    for feature in features:
        if feature.name in seen:
            raise ValueError(f"Expected unique feature names. Received: {feature.name!r} more than once")
        seen.add(feature.name)
        if feature.table not in index:
            raise ValueError(f"Feature {feature.name!r} reads table {feature.table!r}, which is not one of "
                             f"the tables {list(table_names)}")
        result.append(index[feature.table])
    return tuple(result)


def default_features(table_names: Sequence[str]) -> tuple[FeatureConfig, ...]:
    """One one-hot ``sum`` feature per table, named like the table (the DLRM layout)."""
    return tuple(FeatureConfig(name=name, table=name) for name in table_names)


def parse_width_mapping(text: str, flag: str = "--embedding_dims") -> dict[str, int]:
    """``"cat_0:16,cat_3:64"`` -> ``{"cat_0": 16, "cat_3": 64}``; raises naming the flag."""
    widths: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, separator, value = part.rpartition(":")
        try:
            width = int(value)
        except ValueError:
            width = 0
        if not separator or not name or width < 1:
            raise ValueError(f"Expected {flag} as name:width pairs with positive widths, e.g. cat_0:16,cat_3:64. "
                             f"Received: {part!r}")
        widths[name] = width
    return widths


def check_width_mapping(widths: Mapping[str, int], table_names: Sequence[str], flag: str = "--embedding_dims") -> None:
    unknown = sorted(set(widths) - set(table_names))
    if unknown:
        raise ValueError(f"{flag} names unknown table(s) {unknown}. Tables: {list(table_names)[:10]}")
