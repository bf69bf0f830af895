"""The optimizers a table can ask for: plain frozen settings, one class per optimizer.

A table's optimizer updates only the rows a step touched (the sparse update of
:mod:`tf_dlrm.optimizers`); its state is shaped like the table and lives with each shard, so
whatever moves a column slice moves its state. Every class takes ``learning_rate`` and its own
hyper-parameters; :func:`get` also takes the snake_case name (``"lazy_adam"``) for the defaults.
``learning_rate=None`` means the trainer's embedding rate (``main.py``'s ``--embedding_learning_rate``
on its schedule); a table whose ``optimizer`` is None trains with the trainer's default optimizer,
:data:`DEFAULT_OPTIMIZER` unless the trainer is given another.

    table = TableConfig("items", 100_000, 16, optimizer=LazyAdam(learning_rate=3e-3))
    table = TableConfig("users", 10_000, 16, optimizer="rowwise_adagrad")
"""

from __future__ import annotations

import dataclasses
import math

from tf_dlrm.optimizers.catch_up_adam import SparseCatchUpAdam as _CatchUpAdam
from tf_dlrm.optimizers.dense_adam import SparseDenseAdam as _DenseAdam
from tf_dlrm.optimizers.lazy_adam import SparseLazyAdam as _LazyAdam
from tf_dlrm.optimizers.rowwise_adagrad import SparseRowwiseAdagrad as _RowwiseAdagrad
from tf_dlrm.optimizers.sparse_adagrad import SparseAdagrad as _SparseAdagrad
from tf_dlrm.optimizers.sparse_ftrl import SparseFtrl as _SparseFtrl
from tf_dlrm.optimizers.sparse_optimizer import SparseOptimizer
from tf_dlrm.optimizers.sparse_sgd import SparseSGD as _SparseSGD


def _check_rate(owner: str, value) -> None:
    if value is not None:
        _check_positive(owner, "learning_rate", value)


def _check_positive(owner: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"Expected {name} to be a positive number for {owner}. Received: {name}={value!r}")


def _check_fraction(owner: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"Expected {name} in [0, 1) for {owner}. Received: {name}={value!r}")


@dataclasses.dataclass(frozen=True)
class SGD:
    """Plain SGD on the touched rows: ``w -= learning_rate * g``."""

    learning_rate: float = 0.01
    name = "sgd"

    def __post_init__(self):
        _check_rate("SGD", self.learning_rate)

    def make(self) -> SparseOptimizer:
        return _SparseSGD()


@dataclasses.dataclass(frozen=True)
class Adagrad:
    """Adagrad with one accumulator per element of a touched row."""

    learning_rate: float = 0.01
    initial_accumulator_value: float = 0.1
    epsilon: float = 1e-7
    name = "adagrad"

    def __post_init__(self):
        _check_rate(type(self).__name__, self.learning_rate)
        for field in ("initial_accumulator_value", "epsilon"):
            _check_positive(type(self).__name__, field, getattr(self, field))

    def make(self) -> SparseOptimizer:
        return _SparseAdagrad(self.initial_accumulator_value, self.epsilon)


@dataclasses.dataclass(frozen=True)
class RowWiseAdagrad(Adagrad):
    """Adagrad with one accumulator per row (the mean of the row's squared gradient): a table's
    state is one column instead of a copy of the table. A model may use one row-wise setting."""

    name = "rowwise_adagrad"

    def make(self) -> SparseOptimizer:
        return _RowwiseAdagrad(self.initial_accumulator_value, self.epsilon)


@dataclasses.dataclass(frozen=True)
class LazyAdam:
    """Adam whose moments and step move only for the rows a step touched."""

    learning_rate: float = 0.001
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-7
    name = "lazy_adam"

    def __post_init__(self):
        _check_rate("LazyAdam", self.learning_rate)
        _check_fraction("LazyAdam", "beta_1", self.beta_1)
        _check_fraction("LazyAdam", "beta_2", self.beta_2)
        _check_positive("LazyAdam", "epsilon", self.epsilon)

    def make(self) -> SparseOptimizer:
        return _LazyAdam(self.beta_1, self.beta_2, self.epsilon)


@dataclasses.dataclass(frozen=True)
class CatchUpAdam(LazyAdam):
    """Lazy Adam that, when a row is touched again, first applies in closed form the steps it skipped
    (its moments decay, its momentum keeps moving it), so the row ends where dense Adam would put it;
    one more state slot (each row's last step) than lazy Adam."""

    name = "catch_up_adam"

    def make(self) -> SparseOptimizer:
        return _CatchUpAdam(self.beta_1, self.beta_2, self.epsilon)


@dataclasses.dataclass(frozen=True)
class DenseAdam(LazyAdam):
    """Adam on the whole table every step (Keras' dense Adam): for small tables only."""

    name = "dense_adam"

    def make(self) -> SparseOptimizer:
        return _DenseAdam(self.beta_1, self.beta_2, self.epsilon)


@dataclasses.dataclass(frozen=True)
class FTRL:
    """FTRL-Proximal without regularisation (the wide part of Wide & Deep)."""

    learning_rate: float = 0.01
    initial_accumulator_value: float = 0.1
    name = "ftrl"

    def __post_init__(self):
        _check_rate("FTRL", self.learning_rate)
        _check_positive("FTRL", "initial_accumulator_value", self.initial_accumulator_value)

    def make(self) -> SparseOptimizer:
        return _SparseFtrl(self.initial_accumulator_value)


OPTIMIZERS = {cls.name: cls for cls in (SGD, Adagrad, RowWiseAdagrad, LazyAdam, CatchUpAdam, DenseAdam, FTRL)}
# The optimizer of a table that names none, in the library and in main.py (--embedding_optimizer,
# --embedding_learning_rate): chosen on real data (benchmarks/results/model_quality.md).
DEFAULT_OPTIMIZER = CatchUpAdam(learning_rate=0.003)
TableOptimizer = SGD | Adagrad | RowWiseAdagrad | LazyAdam | CatchUpAdam | DenseAdam | FTRL


def get(identifier, owner: str = "a table") -> TableOptimizer | None:
    """An optimizer object from itself or its snake_case name (defaults); None stays None (the
    trainer's default optimizer)."""
    if identifier is None:
        return None
    if isinstance(identifier, tuple(OPTIMIZERS.values())):
        return identifier
    if isinstance(identifier, str) and identifier in OPTIMIZERS:
        return OPTIMIZERS[identifier]()
    raise ValueError(f"Expected the optimizer of {owner} to be one of {sorted(OPTIMIZERS)} or an object of "
                     f"tf_dlrm.embedding.optimizers. Received: optimizer={identifier!r}")


def to_config(optimizer: TableOptimizer | None) -> dict | None:
    return None if optimizer is None else {"name": optimizer.name, **dataclasses.asdict(optimizer)}


def from_config(config: dict | None) -> TableOptimizer | None:
    if config is None:
        return None
    config = dict(config)
    return OPTIMIZERS[config.pop("name")](**config)


def from_settings(settings, name: str | None = None, learning_rate: float | None = None) -> TableOptimizer:
    """The table optimizer a run's settings describe (``settings``: a
    :class:`tf_dlrm.optimizers.settings.OptimizerConfig`): ``name`` (default its
    ``embedding_optimizer``) with the run's hyper-parameters (``--adagrad_*``, ``--adam_*``), at
    ``learning_rate`` (default the embedding base rate; both relative to the schedule, which drives
    every rate). ``.make()`` gives the sparse optimizer that updates the rows."""
    name = name or settings.embedding_optimizer
    rate = learning_rate or settings.schedule.base * settings.embedding_rate_factor
    if name in ("adagrad", "rowwise_adagrad"):
        kind = Adagrad if name == "adagrad" else RowWiseAdagrad
        return kind(rate, initial_accumulator_value=settings.adagrad_initial_accumulator, epsilon=settings.adagrad_epsilon)
    if name == "ftrl":
        return FTRL(rate, initial_accumulator_value=settings.adagrad_initial_accumulator)
    if name in ("lazy_adam", "catch_up_adam", "dense_adam"):
        return OPTIMIZERS[name](rate, beta_1=settings.adam_beta1, beta_2=settings.adam_beta2, epsilon=settings.adam_epsilon)
    if name == "sgd":
        return SGD(rate)
    raise ValueError(f"Expected --embedding_optimizer in {sorted(OPTIMIZERS)}. Received: {name!r}")
