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

import keras

# The config lives in a TF-free module (flags parse into it); kept importable from here.
from tf_dlrm.optimizers.settings import EMBEDDING_OPTIMIZERS, OPTIMIZERS, OptimizerConfig  # noqa: F401
from tf_dlrm.optimizers.catch_up_adam import CatchUpAdam
from tf_dlrm.optimizers.dense_adam import DenseAdam
from tf_dlrm.optimizers.lamb import Lamb
from tf_dlrm.optimizers.lazy_adam import LazyAdam
from tf_dlrm.optimizers.rowwise_adagrad import RowwiseAdagrad
from tf_dlrm.optimizers.sparse_adagrad import SparseAdagrad
from tf_dlrm.optimizers.sparse_ftrl import SparseFtrl
from tf_dlrm.optimizers.sparse_optimizer import SparseOptimizer
from tf_dlrm.optimizers.sparse_sgd import SparseSGD


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
    if name == "catch_up_adam":
        return CatchUpAdam(config.adam_beta1, config.adam_beta2, config.adam_epsilon)
    if name == "dense_adam":
        return DenseAdam(config.adam_beta1, config.adam_beta2, config.adam_epsilon)
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
