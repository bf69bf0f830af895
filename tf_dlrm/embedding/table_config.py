"""Tables and the features that read them: plain frozen data, no TensorFlow.

A *table* is a ``[vocabulary_size, embedding_dim]`` matrix of trainable vectors with its own
initializer, optimizer and placement; a *feature* is one input of ids that reads one table and
pools the vectors of a sample's ids into one vector (``sum``, ``mean`` or ``sqrtn``), or, with no
combiner (``combiner=None``, a *sequence* feature), returns them unpooled as ``[batch, hotness, dim]``. A feature holds
its table object, so several features share a table by holding the same one (a user's clicked
items and the candidate item). The split follows keras-rs and TF's TPU embedding API.

Ids of a feature arrive as one of:

- a dense ``[batch]`` tensor: one id per sample (``hotness == 1``);
- a dense ``[batch, hotness]`` tensor: exactly ``hotness`` ids per sample (fixed hotness);
- a ``tf.RaggedTensor`` ``[batch, None]`` (``ragged=True``): at most ``hotness`` ids per sample.
  An empty row pools to a zero vector under every combiner (its gradient is zero too).

There is no pad id: every id must lie in ``[0, vocabulary_size)``; an id outside it is an error
naming the feature, never a silent read of a neighbouring table's row.

A ``weighted`` feature takes a float weight per id beside its ids (the same shape: ``[batch]``,
``[batch, hotness]`` or a ragged tensor with the ids' row lengths). Its combiners are weighted:
``sum`` is ``sum_i w_i e_i``, ``mean`` is ``sum_i w_i e_i / sum_i w_i``, ``sqrtn`` is
``sum_i w_i e_i / sqrt(sum_i w_i^2)`` (TensorFlow's ``safe_embedding_lookup_sparse``); a sequence
feature returns ``w_i e_i`` at position ``i``. The gradient reaching row ``e_i`` is the pooled
gradient times ``w_i`` (times the combiner's factor). A sample whose weights sum to zero pools to zeros.

A sequence feature's output is padded, not ragged: position ``i >= `` a sample's id count holds
zeros, and receives no gradient (a model masks it with the ids' row lengths). Padding keeps the
exchange's blocks rectangular: a sequence feature of hotness ``H`` travels as ``H`` one-id features.

Placement (where a table lives and how it is stored) is a request the sharding plan honours:

- ``"auto"``: the planner decides (replicated under the layer's ``data_parallel_threshold`` rows,
  else table-wise, cut into column slices, or, when its columns are fewer than the ranks, into row
  bands, to balance memory and exchanged bytes);
- ``"table_wise"``: whole on one rank; ``"column_wise"``: cut into ``min(ranks, dim)`` column slices;
  ``"row_wise"``: cut into ``min(ranks, rows)`` row bands (each band sends the pooled vectors of its
  own ids, the receiver adds them); ``"grid"``: row bands each cut into column slices;
- ``"replicated"``: whole on every rank, its gradient averaged like a dense weight's;
- :class:`Placement` adds storage options to a sharding: ``hot_rows`` (ids replicated on every
  rank, so only the other rows travel), ``storage="split_bfloat16"`` (the table kept as two 16-bit
  halves, looked up in bfloat16, updated in float32), or ``dynamic=DynamicStorage(...)`` (a hashed
  table of raw int64 keys with a fixed capacity and an eviction policy).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence

import numpy as np

import tf_dlrm.embedding.optimizers as table_optimizers
from tf_dlrm.sharding.dynamic_routing import CapacityScope, EvictionPolicy


class Combiner(str, enum.Enum):
    """How the vectors of one sample's ids become one vector.

    ``sum``: their sum; ``mean``: sum / count; ``sqrtn``: sum / sqrt(count) (TF's
    ``safe_embedding_lookup_sparse`` names); an empty sample gives zeros.
    """

    SUM = "sum"
    MEAN = "mean"
    SQRTN = "sqrtn"


class Sharding(str, enum.Enum):
    AUTO = "auto"
    TABLE_WISE = "table_wise"
    COLUMN_WISE = "column_wise"
    ROW_WISE = "row_wise"
    GRID = "grid"
    REPLICATED = "replicated"


class Storage(str, enum.Enum):
    FLOAT32 = "float32"
    SPLIT_BFLOAT16 = "split_bfloat16"


EVICTIONS = tuple(p.value for p in EvictionPolicy)
CAPACITY_SCOPES = tuple(s.value for s in CapacityScope)


def _check_positive_int(owner: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Expected {name} to be a positive integer for {owner}. Received: {name}={value!r}")


def _check_name(kind: str, name) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"Expected a non-empty {kind} name. Received: name={name!r}")


@dataclasses.dataclass(frozen=True)
class DynamicStorage:
    """A dynamic table: raw int64 keys get rows on first sight in training, up to ``capacity`` rows
    per rank (``capacity_scope="total"``: over all ranks); when full, ``eviction`` (``none``, ``lru``,
    ``lfu``) decides; a key gets a row after ``min_count`` sightings. With ``max_idle_steps=T``, a row whose
    key no training step looked up in the last ``T`` steps is dropped (the key, seen again, starts over as
    a new key). Unseen keys read zeros. The table's ``vocabulary_size`` is ignored."""

    capacity: int
    eviction: str = "none"
    min_count: int = 1
    capacity_scope: str = "per_rank"
    max_idle_steps: int | None = None

    def __post_init__(self):
        _check_positive_int("a dynamic table", "capacity", self.capacity)
        _check_positive_int("a dynamic table", "min_count", self.min_count)
        if self.max_idle_steps is not None:
            _check_positive_int("a dynamic table", "max_idle_steps", self.max_idle_steps)
        if self.eviction not in EVICTIONS:
            raise ValueError(f"Expected eviction in {list(EVICTIONS)}. Received: eviction={self.eviction!r}")
        if self.capacity_scope not in CAPACITY_SCOPES:
            raise ValueError(f"Expected capacity_scope in {list(CAPACITY_SCOPES)}. "
                             f"Received: capacity_scope={self.capacity_scope!r}")


@dataclasses.dataclass(frozen=True)
class FrequencyRegularizer:
    """Regularization of a table's rows by how often training has seen them
    (:mod:`tf_dlrm.embedding.row_frequency`): each row counts the training steps that looked it up; a
    row is not updated before its count reaches ``min_count`` (it keeps its initial values), and each
    touched row's gradient gets ``l2 * w / (count * global batch)`` added (rare rows pulled towards zero,
    frequent ones barely; per sample, as the loss is a batch mean). One setting per model (every table of
    a model takes the same one, or none)."""

    l2: float = 0.0
    min_count: int = 1

    def __post_init__(self):
        if isinstance(self.l2, bool) or not isinstance(self.l2, (int, float)) or not 0 <= self.l2 < math.inf:
            raise ValueError(f"Expected l2 >= 0 for a frequency regularizer. Received: l2={self.l2!r}")
        _check_positive_int("a frequency regularizer", "min_count", self.min_count)
        object.__setattr__(self, "l2", float(self.l2))

    @property
    def active(self) -> bool:
        return self.l2 > 0 or self.min_count > 1


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a table lives (``sharding``) and how it is stored (see the module docstring)."""

    sharding: str = Sharding.AUTO.value
    hot_rows: tuple[int, ...] = ()
    storage: str = Storage.FLOAT32.value
    dynamic: DynamicStorage | None = None

    def __post_init__(self):
        try:
            object.__setattr__(self, "sharding", Sharding(self.sharding).value)
        except ValueError:
            raise ValueError(f"Expected placement in {[s.value for s in Sharding]}. Received: {self.sharding!r}") from None
        try:
            object.__setattr__(self, "storage", Storage(self.storage).value)
        except ValueError:
            raise ValueError(f"Expected storage in {[s.value for s in Storage]}. Received: storage={self.storage!r}") from None
        hot = tuple(sorted({int(i) for i in self.hot_rows}))
        if any(i < 0 for i in hot):
            raise ValueError(f"Expected hot_rows to be ids >= 0. Received: {min(hot)}")
        object.__setattr__(self, "hot_rows", hot)
        if isinstance(self.dynamic, dict):
            object.__setattr__(self, "dynamic", DynamicStorage(**self.dynamic))
        if self.hot_rows and self.sharding == Sharding.REPLICATED.value:
            raise ValueError("A replicated table has no cold rows: hot_rows needs a model-parallel placement")
        if self.dynamic is not None and (self.hot_rows or self.storage != Storage.FLOAT32.value
                                         or self.sharding != Sharding.AUTO.value):
            raise ValueError("A dynamic table is sharded by key hash: it takes no sharding, hot_rows or storage option")

    def to_dict(self) -> dict:
        return {"sharding": self.sharding, "hot_rows": list(self.hot_rows), "storage": self.storage,
                "dynamic": None if self.dynamic is None else dataclasses.asdict(self.dynamic)}


def as_placement(value) -> Placement:
    if isinstance(value, Placement):
        return value
    if isinstance(value, str):
        return Placement(sharding=value)
    if isinstance(value, dict):
        return Placement(**value)
    raise ValueError(f"Expected placement to be one of {[s.value for s in Sharding]} or a Placement. Received: {value!r}")


INITIALIZERS = ("uniform_sqrt_rows", "zeros")
# The default initial values: uniform in [-0.05, 0.05], as Keras's Embedding draws; measured better than the DLRM
# reference's 1/sqrt(rows) on real data (benchmarks/results/model_quality.md).
DEFAULT_INIT_BOUND = 0.05


def initial_bound(initializer, owner: str) -> float | None:
    """The half-width ``b`` of uniform ``[-b, b]`` initial values an initializer asks for
    (:data:`DEFAULT_INIT_BOUND` for None; None for ``"uniform_sqrt_rows"``: ``1/sqrt(rows)``; 0: zeros).
    Initial values are drawn from ``(seed, table)`` block by block, so every sharding of a table starts
    from the same values: only uniform initializers symmetric around zero (and zeros) can be drawn that way."""
    if initializer is None:
        return DEFAULT_INIT_BOUND
    if initializer == "uniform_sqrt_rows":
        return None
    if initializer == "zeros":
        return 0.0
    if isinstance(initializer, (int, float)) and not isinstance(initializer, bool) and 0 <= initializer < math.inf:
        return float(initializer)
    config = getattr(initializer, "get_config", lambda: None)()
    kind = type(initializer).__name__
    if kind == "Zeros":
        return 0.0
    if kind == "RandomUniform" and config and math.isclose(-config["minval"], config["maxval"]) and config["maxval"] > 0:
        return float(config["maxval"])
    raise ValueError(f"Expected the initializer of {owner} to be one of {list(INITIALIZERS)}, a bound b >= 0 of "
                     "uniform [-b, b], keras.initializers.Zeros() or a RandomUniform(-b, b): initial values are drawn "
                     f"per row block so that every sharding starts alike. Received: initializer={initializer!r}")


@dataclasses.dataclass(frozen=True)
class TableConfig:
    """One embedding table.

    Attributes:
        name: unique table name.
        vocabulary_size: number of ids (rows).
        embedding_dim: length of each vector.
        initializer: None (uniform in ``[-0.05, 0.05]``, :data:`DEFAULT_INIT_BOUND`),
            ``"uniform_sqrt_rows"`` (uniform in ``[-1/sqrt(rows), 1/sqrt(rows)]``), ``"zeros"``, a bound
            ``b`` (uniform ``[-b, b]``), ``keras.initializers.RandomUniform(-b, b)`` or
            ``keras.initializers.Zeros()``; drawn from ``(seed, table)`` only (see :func:`initial_bound`).
        optimizer: an object of :mod:`tf_dlrm.embedding.optimizers` or its snake_case name; None:
            the trainer's default (:data:`tf_dlrm.embedding.optimizers.DEFAULT_OPTIMIZER`,
            ``CatchUpAdam(learning_rate=0.003)``, which ``main.py``'s ``--embedding_optimizer`` and
            ``--embedding_learning_rate`` default to).
        placement: ``"auto"``, ``"table_wise"``, ``"column_wise"``, ``"replicated"`` or a
            :class:`Placement`.
        frequency_regularizer: None, or a :class:`FrequencyRegularizer` (or its dict) for rare ids:
            admission after ``min_count`` looked-up steps and ``l2 / (count * batch)`` on touched rows
            (``main.py``'s ``--embedding_min_count`` and ``--embedding_frequency_l2``).
    """

    name: str
    vocabulary_size: int
    embedding_dim: int
    initializer: object = None
    optimizer: object = None
    placement: object = Sharding.AUTO.value
    frequency_regularizer: object = None

    def __post_init__(self):
        _check_name("table", self.name)
        owner = f"table {self.name!r}"
        _check_positive_int(owner, "vocabulary_size", self.vocabulary_size)
        _check_positive_int(owner, "embedding_dim", self.embedding_dim)
        initial_bound(self.initializer, owner)
        object.__setattr__(self, "optimizer", table_optimizers.get(self.optimizer, owner))
        object.__setattr__(self, "placement", as_placement(self.placement))
        regularizer = self.frequency_regularizer
        if isinstance(regularizer, dict):
            regularizer = FrequencyRegularizer(**regularizer)
        if regularizer is not None and not isinstance(regularizer, FrequencyRegularizer):
            raise ValueError(f"Expected frequency_regularizer of {owner} to be None or a FrequencyRegularizer. "
                             f"Received: frequency_regularizer={regularizer!r}")
        # An inactive setting is no setting: the table keeps no counts.
        object.__setattr__(self, "frequency_regularizer", regularizer if regularizer is not None and regularizer.active else None)
        if self.frequency_regularizer is not None and self.placement.dynamic is not None:
            raise ValueError(f"A dynamic table admits keys by its own min_count: {owner} takes no frequency_regularizer")
        if self.placement.hot_rows and self.placement.hot_rows[-1] >= self.vocabulary_size:
            raise ValueError(f"Expected hot_rows of {owner} in [0, {self.vocabulary_size}). "
                             f"Received: {self.placement.hot_rows[-1]}")

    @property
    def init_bound(self) -> float | None:
        return initial_bound(self.initializer, f"table {self.name!r}")

    @property
    def dynamic(self) -> bool:
        return self.placement.dynamic is not None

    def to_dict(self) -> dict:
        bound = self.init_bound
        return {"name": self.name, "vocabulary_size": self.vocabulary_size, "embedding_dim": self.embedding_dim,
                "initializer": "uniform_sqrt_rows" if bound is None else bound,
                "optimizer": table_optimizers.to_config(self.optimizer), "placement": self.placement.to_dict(),
                "frequency_regularizer": None if self.frequency_regularizer is None
                else dataclasses.asdict(self.frequency_regularizer)}

    @classmethod
    def from_dict(cls, config: dict) -> TableConfig:
        config = dict(config)
        if isinstance(config.get("optimizer"), dict):
            config["optimizer"] = table_optimizers.from_config(config["optimizer"])
        return cls(**config)


@dataclasses.dataclass(frozen=True)
class FeatureConfig:
    """One input feature: which table it reads and how a sample's ids are pooled.

    Attributes:
        name: unique feature name (the key of the id and output dicts).
        table: the :class:`TableConfig` it reads (features sharing a table hold the same one). Code
            that builds layers from a sharding plan may name the table instead.
        hotness: ids per sample (fixed), or the most ids a sample may have (``ragged``).
        ragged: ids come as a ``tf.RaggedTensor`` with a variable count per sample.
        combiner: a :class:`Combiner` value, or None for a sequence feature (its vectors unpooled,
            ``[batch, hotness, dim]``, zeros past a sample's last id).
        weighted: the feature takes a weight per id beside its ids (see the module docstring).
    """

    name: str
    table: object
    hotness: int = 1
    ragged: bool = False
    combiner: str | None = Combiner.SUM.value
    weighted: bool = False

    def __post_init__(self):
        _check_name("feature", self.name)
        if isinstance(self.table, dict):
            object.__setattr__(self, "table", TableConfig.from_dict(self.table))
        if not isinstance(self.table, TableConfig):
            _check_name("table", self.table)
        _check_positive_int(f"feature {self.name!r}", "hotness", self.hotness)
        try:
            if self.combiner is not None:
                object.__setattr__(self, "combiner", Combiner(self.combiner).value)
        except ValueError:
            allowed = [c.value for c in Combiner] + [None]
            raise ValueError(f"Expected combiner in {allowed} for feature {self.name!r}. "
                             f"Received: combiner={self.combiner!r}") from None
        # Refused, not coerced: FeatureConfig(name, table, hotness, "mean") would read "mean" as ragged.
        if not isinstance(self.ragged, (bool, np.bool_)):
            raise ValueError(f"Expected ragged True or False for feature {self.name!r}. Received: ragged={self.ragged!r}")
        object.__setattr__(self, "ragged", bool(self.ragged))
        if not isinstance(self.weighted, (bool, np.bool_)):
            raise ValueError(f"Expected weighted True or False for feature {self.name!r}. Received: weighted={self.weighted!r}")
        object.__setattr__(self, "weighted", bool(self.weighted))

    @property
    def table_name(self) -> str:
        return self.table.name if isinstance(self.table, TableConfig) else self.table

    @property
    def one_hot(self) -> bool:
        """One id per sample, given as a ``[batch]`` tensor, unweighted and pooled: no pooling at all."""
        return self.hotness == 1 and not self.ragged and not self.weighted and not self.sequence

    @property
    def sequence(self) -> bool:
        """No combiner: the vectors come back unpooled, ``[batch, hotness, dim]``."""
        return self.combiner is None

    def to_dict(self) -> dict:
        table = self.table.to_dict() if isinstance(self.table, TableConfig) else self.table
        return {"name": self.name, "table": table, "hotness": self.hotness, "ragged": self.ragged,
                "combiner": self.combiner, "weighted": self.weighted}


def as_feature_config(value) -> FeatureConfig:
    return value if isinstance(value, FeatureConfig) else FeatureConfig(**dict(value))


def tables_of(features: Sequence[FeatureConfig]) -> tuple[TableConfig, ...]:
    """The distinct tables of ``features``, in order of first use; raises on two different tables
    with one name."""
    tables: dict[str, TableConfig] = {}
    for feature in features:
        table = feature.table
        if not isinstance(table, TableConfig):
            raise ValueError(f"Expected feature {feature.name!r} to hold its TableConfig. Received: table={table!r}")
        if table.name in tables and tables[table.name] != table:
            raise ValueError(f"Two different tables are named {table.name!r}: features sharing a table must hold "
                             "the same TableConfig")
        tables.setdefault(table.name, table)
    return tuple(tables.values())


def feature_tables(features: Sequence[FeatureConfig], table_names: Sequence[str]) -> tuple[int, ...]:
    """The table index of every feature; raises naming a feature whose table does not exist."""
    index = {name: i for i, name in enumerate(table_names)}
    seen = set()
    result = []
    for feature in features:
        if feature.name in seen:
            raise ValueError(f"Expected unique feature names. Received: {feature.name!r} more than once")
        seen.add(feature.name)
        if feature.table_name not in index:
            raise ValueError(f"Feature {feature.name!r} reads table {feature.table_name!r}, which is not one of "
                             f"the tables {list(table_names)}")
        result.append(index[feature.table_name])
    return tuple(result)


def default_features(table_names: Sequence[str]) -> tuple[FeatureConfig, ...]:
    """One one-hot ``sum`` feature per table, named like the table (the DLRM layout)."""
    return tuple(FeatureConfig(name=name, table=name) for name in table_names)
