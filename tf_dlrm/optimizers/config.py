"""The optimizer settings of a run (one frozen config) and the optimizers they make.

Two families, each with its own base rate on the one learning-rate schedule:

- embeddings (``sharded`` and ``replicated`` variables): a sparse optimizer of
  :mod:`tf_dlrm.optimizers` (``sgd``, ``adagrad``, ``rowwise_adagrad``, ``lazy_adam``, ``ftrl``), at
  ``embedding_learning_rate``;
- dense weights (MLPs): ``sgd``, ``adam``, ``adagrad`` (Keras) or ``lamb`` (ours), at
  ``dense_learning_rate``, on the gradient averaged over ranks.

A rate of 0 means the schedule's own base (``--learning_rate``). At step ``s`` each family's rate is
``its base * schedule(s) / schedule.base``: warmup and decay drive both.
"""

from __future__ import annotations

import dataclasses

import keras

from tf_dlrm.optimizers.lamb import Lamb
from tf_dlrm.optimizers.lazy_adam import LazyAdam, check_adam_arguments
from tf_dlrm.optimizers.rowwise_adagrad import RowwiseAdagrad
from tf_dlrm.optimizers.sparse_adagrad import SparseAdagrad
from tf_dlrm.optimizers.sparse_ftrl import SparseFtrl
from tf_dlrm.optimizers.sparse_optimizer import SparseOptimizer
from tf_dlrm.optimizers.sparse_sgd import SparseSGD
from tf_dlrm.train.schedule import LearningRateSchedule

OPTIMIZERS = ("sgd", "adam", "adagrad", "lamb")
EMBEDDING_OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad", "lazy_adam", "ftrl")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """``loss_scale``: float16 only (ignored for float32 and bfloat16): a static scale, or 0 for
    dynamic loss scaling (see :class:`tf_dlrm.train.step.LossScale`). Rates of 0 mean the
    schedule's base. Weight decays are L2 coefficients: added to the gradient of the touched
    embedding rows, and to the MLPs' gradients (LAMB: inside its trust ratio instead)."""

    schedule: LearningRateSchedule
    optimizer: str = "sgd"
    loss_scale: float = 1.0
    dense_learning_rate: float = 0.0
    embedding_optimizer: str = "sgd"
    embedding_learning_rate: float = 0.0
    adagrad_initial_accumulator: float = 0.1
    adagrad_epsilon: float = 1e-7
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    embedding_weight_decay: float = 0.0
    dense_weight_decay: float = 0.0

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"Expected --optimizer in {OPTIMIZERS}. Received: optimizer={self.optimizer!r}")
        if self.embedding_optimizer not in EMBEDDING_OPTIMIZERS:
            raise ValueError(f"Expected --embedding_optimizer in {EMBEDDING_OPTIMIZERS}. "
                             f"Received: embedding_optimizer={self.embedding_optimizer!r}")
        if self.loss_scale < 0:
            raise ValueError(f"Expected a loss scale >= 0 (0: dynamic). Received: loss_scale={self.loss_scale}")
        for name in ("dense_learning_rate", "embedding_learning_rate", "embedding_weight_decay", "dense_weight_decay",
                     "adagrad_initial_accumulator", "adagrad_epsilon"):
            if getattr(self, name) < 0:
                raise ValueError(f"Expected --{name} >= 0. Received: {name}={getattr(self, name)}")
        # Checked here, before any work: building a Keras optimizer would start TensorFlow's runtime
        # before main.py sets its thread counts.
        try:
            check_adam_arguments(self.adam_beta1, self.adam_beta2, self.adam_epsilon)
        except ValueError as error:
            raise ValueError(f"{error} (flags --adam_beta1, --adam_beta2, --adam_epsilon)") from None

    @property
    def dense_rate_factor(self) -> float:
        """The MLPs' rate over the schedule's, at every step."""
        return self.dense_learning_rate / self.schedule.base if self.dense_learning_rate else 1.0

    @property
    def embedding_rate_factor(self) -> float:
        """The embeddings' rate over the schedule's, at every step."""
        return self.embedding_learning_rate / self.schedule.base if self.embedding_learning_rate else 1.0

    def record(self) -> dict:
        """The settings as plain data (checkpoint manifests, logs)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "schedule"}
        schedule = {k: getattr(self.schedule, k) for k in ("base", "warmup_steps", "decay_start_step", "decay_steps")}
        return {"name": self.optimizer, "schedule": schedule, **fields}


def make_sparse_optimizer(config: OptimizerConfig) -> SparseOptimizer:
    name = config.embedding_optimizer
    if name == "adagrad":
        return SparseAdagrad(config.adagrad_initial_accumulator, config.adagrad_epsilon)
    if name == "rowwise_adagrad":
        return RowwiseAdagrad(config.adagrad_initial_accumulator, config.adagrad_epsilon)
    if name == "ftrl":
        # FTRL's accumulator starts like Adagrad's (--adagrad_initial_accumulator); no l1 / l2.
        return SparseFtrl(config.adagrad_initial_accumulator)
    if name == "lazy_adam":
        return LazyAdam(config.adam_beta1, config.adam_beta2, config.adam_epsilon)
    return SparseSGD()


def make_dense_optimizer(config: OptimizerConfig) -> keras.optimizers.Optimizer:
    base = config.dense_learning_rate or config.schedule.base
    adam = dict(beta_1=config.adam_beta1, beta_2=config.adam_beta2, epsilon=config.adam_epsilon)
    if config.optimizer == "adam":
        return keras.optimizers.Adam(learning_rate=base, **adam)
    if config.optimizer == "adagrad":
        return keras.optimizers.Adagrad(
            learning_rate=base, initial_accumulator_value=config.adagrad_initial_accumulator, epsilon=config.adagrad_epsilon
        )
    if config.optimizer == "lamb":
        return Lamb(learning_rate=base, weight_decay_rate=config.dense_weight_decay, **adam)
    return keras.optimizers.SGD(learning_rate=base)
