"""The dense optimizer a run's settings (:class:`tf_dlrm.optimizers.settings.OptimizerConfig`) make:
``sgd``, ``adam``, ``adagrad`` (Keras) or ``lamb`` (ours), at ``dense_learning_rate``, on the gradient
averaged over ranks. The embeddings' optimizer comes from the same settings through the one table-optimizer
factory, :func:`tf_dlrm.embedding.optimizers.from_settings`.

A rate of 0 means the schedule's own base (``--learning_rate``). At step ``s`` each family's rate is
``its base * schedule(s) / schedule.base``: warmup and decay drive both.
"""
from __future__ import annotations

import keras

from tf_dlrm.optimizers.lamb import Lamb
from tf_dlrm.optimizers.settings import OptimizerConfig


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
