"""The training and evaluation steps of hybrid-parallel DLRM, as tf.functions.

Gradients, with N ranks each computing the mean loss over its local batch:

- MLP and replicated-table gradients: averaged over ranks with one grouped allreduce, which gives
  the gradient of the global mean loss ``L = (1/N) sum_r loss_r``;
- embedding shards: the alltoall's backward already summed every rank's contribution, i.e.
  ``N * grad(L)``; they are scaled by ``1/N`` and stay sparse (``IndexedSlices``), applied with one
  scatter per fused variable to the touched rows only.

All embeddings train with SGD; the MLPs with SGD or Adam. One learning-rate schedule drives both.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from tf_dlrm.distributed import collectives
from tf_dlrm.distributed.env import DistributedEnv
from tf_dlrm.train.schedule import LearningRateSchedule

OPTIMIZERS = ("sgd", "adam")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    schedule: LearningRateSchedule
    optimizer: str = "sgd"
    loss_scale: float = 1.0  # static loss scale (float16 only)

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"Expected optimizer in {OPTIMIZERS}. Received: optimizer={self.optimizer!r}")
        if self.loss_scale <= 0:
            raise ValueError(f"Expected a positive loss scale. Received: loss_scale={self.loss_scale}")


def make_dense_optimizer(config: OptimizerConfig) -> keras.optimizers.Optimizer:
    if config.optimizer == "adam":
        return keras.optimizers.Adam(learning_rate=config.schedule.base)
    return keras.optimizers.SGD(learning_rate=config.schedule.base)


def _dense(gradient, variable):
    """Replicated tables are small: a dense gradient joins the grouped allreduce cheaply."""
    if isinstance(gradient, tf.IndexedSlices):
        return tf.math.unsorted_segment_sum(gradient.values, gradient.indices, variable.shape[0])
    return gradient


class Trainer:
    """Owns the optimizer state and the step counter; builds the tf.functions once.

    Args:
        model: a built :class:`tf_dlrm.model.dlrm.DLRM`.
        env: this rank's place.
        config: optimizer settings.
        jit_compile: compile the forward/backward of the dense part with XLA. The Horovod
            collectives stay outside the compiled function.
    """

    def __init__(self, model, env: DistributedEnv, config: OptimizerConfig, jit_compile: bool = False):
        self.model = model
        self.env = env
        self.config = config
        self.jit_compile = jit_compile
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.shards = list(model.embedding.sparse_variables)
        self.replicated = list(model.embedding.dense_variables)
        self.mlp = list(model.mlp_variables)
        # Differentiated but never updated: they keep every rank's backward collectives alive.
        self.padding = list(getattr(model.embedding, "padding_variables", []))
        self.dense_optimizer = make_dense_optimizer(config)
        self.dense_optimizer.build(self.mlp)
        self.learning_rate = tf.Variable(config.schedule.base, dtype=tf.float32, trainable=False, name="learning_rate")
        self.train_step = tf.function(self._train_step, reduce_retracing=True)
        self.predict_step = tf.function(self._predict_step, reduce_retracing=True)

    # ------------------------------------------------------------------ training

    def _loss(self, numerical, categorical, label):
        logits = self.model((numerical, categorical), training=True)
        return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits))

    def _train_step(self, numerical, categorical, label):
        variables = self.shards + self.replicated + self.mlp + self.padding
        with tf.GradientTape() as tape:
            tape.watch([v.value for v in variables])
            loss = self._loss(numerical, categorical, label)
            scaled = loss * self.config.loss_scale if self.config.loss_scale != 1.0 else loss
        gradients = tape.gradient(scaled, [v.value for v in variables])
        if self.config.loss_scale != 1.0:
            gradients = [_unscale(g, self.config.loss_scale) for g in gradients]
        shard_grads = gradients[: len(self.shards)]
        dense_vars = self.replicated + self.mlp
        dense_grads = [_dense(g, v) for g, v in zip(gradients[len(self.shards):len(self.shards) + len(dense_vars)], dense_vars)]
        dense_grads = collectives.grouped_mean(self.env, dense_grads, name="dense_gradients")
        rate = self.config.schedule.tensor(self.step)
        self.learning_rate.assign(rate)
        scale = rate / self.env.world_size
        for variable, gradient in zip(self.shards, shard_grads):
            variable.value.scatter_sub(tf.IndexedSlices(gradient.values * scale, gradient.indices))
        replicated_grads = dense_grads[: len(self.replicated)]
        for variable, gradient in zip(self.replicated, replicated_grads):
            variable.assign_sub(gradient * rate)
        self.dense_optimizer.learning_rate = rate
        self.dense_optimizer.apply(dense_grads[len(self.replicated):], self.mlp)
        # Grappler prunes results nobody reads, and a control dependency is not enough to keep
        # them: storing the padding gradient (exactly zero, receivers skip that column) keeps this
        # rank's backward alltoall in the graph, as on every other rank.
        for variable, gradient in zip(self.padding, gradients[len(variables) - len(self.padding):]):
            variable.assign(gradient)
        self.step.assign_add(1)
        return loss

    # ------------------------------------------------------------------ evaluation

    def _predict_step(self, numerical, categorical, label):
        """Click probabilities and labels of the global batch, in global order, on every rank."""
        logits = self.model((numerical, categorical), training=False)
        probabilities = tf.reshape(tf.sigmoid(logits), [-1])
        label = tf.reshape(label, [-1])
        return (
            collectives.allgather(self.env, probabilities, name="eval_predictions"),
            collectives.allgather(self.env, label, name="eval_labels"),
        )

    def broadcast_initial_state(self) -> None:
        """Rank 0's dense weights to every rank (the shards are rank-local and need none)."""
        collectives.broadcast_variables(self.env, self.replicated + self.mlp)


def _unscale(gradient, scale):
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values / scale, gradient.indices, gradient.dense_shape)
    return gradient / scale
