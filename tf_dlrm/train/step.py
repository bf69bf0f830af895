"""main.py's trainer: the library's training step (:mod:`tf_dlrm.embedding.training_step`) driven
by a run's optimizer settings, learning-rate schedule and binary cross-entropy, plus evaluation.

Embeddings train with the sparse optimizer of ``--embedding_optimizer`` (and per-table ones, e.g.
Wide & Deep's ``--wide_optimizer``), the dense weights with ``sgd``, ``adam``, ``adagrad`` or ``lamb``;
one learning-rate schedule drives both, each family at its own base rate.

With ``jit_compile`` the step is cut in three: the embedding lookup and exchange (Horovod ops,
never compiled) under a tape; one XLA-compiled function computing the loss and the gradients of
the dense part with respect to the dense weights and to the exchanged embeddings; then the backward
of the exchange (the alltoall's registered gradient) from those embedding gradients.
"""

from __future__ import annotations

import tensorflow as tf

from tf_dlrm.embedding import optimizers as table_optimizers
from tf_dlrm.embedding.training_step import TrainingStep, embedding_layers, table_optimizer_groups
from tf_dlrm.models.ranking_model import dense_forward
from tf_dlrm.ops import kernels_off
from tf_dlrm.optimizers.config import make_dense_optimizer
from tf_dlrm.optimizers.settings import OptimizerConfig
from tf_dlrm.parallel import collectives
from tf_dlrm.parallel.env import DistributedEnv
from tf_dlrm.spec.format import NUMERICAL_CHANNEL


def binary_cross_entropy(label, logits):
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits))


class Trainer(TrainingStep):
    """Owns the optimizer state, the schedule and the step counter; builds the tf.functions once.

    Args:
        model: a built :class:`tf_dlrm.embedding.Model` (``model(features) -> logits``, ``features`` a dict of
            named inputs as the readers yield them); ``jit_compile`` needs a
            :class:`tf_dlrm.models.ranking_model.RankingModel` (its :meth:`embed` and :meth:`dense_call`).
        env: this rank's place.
        config: optimizer settings.
        jit_compile: compile the forward/backward of the dense part with XLA. The Horovod
            collectives, the embedding lookups and the sparse updates stay outside the compiled
            function.
        compress_dense_gradients: under mixed_bfloat16 with several ranks, average the MLP gradients
            as bfloat16 (``--bf16_dense_allreduce``); ignored otherwise.
        hot_row_sync_every: ``S`` of ``--hot_row_sync_every`` (see :class:`TrainingStep`).
    """

    def __init__(self, model, env: DistributedEnv, config: OptimizerConfig, jit_compile: bool = False,
                 compress_dense_gradients: bool = False, hot_row_sync_every: int = 1):
        self.config = config
        self.jit_compile = bool(jit_compile)
        if self.jit_compile and not (hasattr(model, "embed") and hasattr(model, "dense_call")):
            raise ValueError(f"--xla compiles the part of a model after its embedding lookup, which "
                             f"{type(model).__qualname__} does not name. Expected a tf_dlrm.models.ranking_model.RankingModel "
                             "(embed and dense_call), or no --xla")
        # Tables without an optimizer of their own take --embedding_optimizer; the others (Wide &
        # Deep's wide tables) keep theirs, at their rate relative to the embedding rate.
        default = table_optimizers.from_settings(config)
        sparse_optimizer, per_table, base_rate = table_optimizer_groups(embedding_layers(model), default=default)
        # The schedule shapes every rate: a model whose tables name their optimizer's rate (a library model)
        # trains its base group at that rate over the schedule's base, like --embedding_learning_rate.
        self.embedding_rate_factor = (config.embedding_rate_factor if base_rate in (None, default.learning_rate)
                                      else base_rate / config.schedule.base)
        super().__init__(model, env, loss_fn=lambda x, y, y_pred, sample_weight: binary_cross_entropy(y, y_pred),
                         dense_optimizer=make_dense_optimizer(config), sparse_optimizer=sparse_optimizer or default.make(),
                         table_optimizers=per_table,
                         embedding_weight_decay=config.embedding_weight_decay, loss_scale=config.loss_scale,
                         compress_dense_gradients=compress_dense_gradients, hot_row_sync_every=hot_row_sync_every)
        self.learning_rate = tf.Variable(config.schedule.base, dtype=tf.float32, trainable=False, name="learning_rate")
        self.train_step = tf.function(self._train_step, reduce_retracing=True, autograph=False)
        self.predict_step = tf.function(self._predict_step, reduce_retracing=True, autograph=False)
        self.predict_local = tf.function(self._predict_local, reduce_retracing=True, autograph=False)
        if self.jit_compile:
            self._dense_gradients = tf.function(self._dense_loss_and_gradients, jit_compile=True, reduce_retracing=True, autograph=False)

    def _train_step(self, features, label):
        return self.train(features, label)[0]

    def rates(self):
        rate = self.config.schedule.tensor(self.step)
        self.learning_rate.assign(rate)
        return rate * self.embedding_rate_factor, rate * self.config.dense_rate_factor

    def apply_dense(self, mlp_grads, dense_rate) -> None:
        decay = self.config.dense_weight_decay
        if decay and self.config.optimizer != "lamb":  # LAMB decays inside its trust ratio
            mlp_grads = [g + tf.cast(decay, g.dtype) * tf.cast(v.value, g.dtype) for g, v in zip(mlp_grads, self.mlp)]
        if self.config.optimizer == "sgd":
            # Keras' SGD is a multiply and a subtract per weight; the fused kernel does both in one pass.
            for variable, gradient in zip(self.mlp, mlp_grads):
                tf.raw_ops.ResourceApplyGradientDescent(var=variable.value.handle, alpha=tf.cast(dense_rate, gradient.dtype), delta=gradient)
            self.dense_optimizer.iterations.assign_add(1)
        else:
            self.dense_optimizer.learning_rate = dense_rate
            self.dense_optimizer.apply(mlp_grads, self.mlp)

    def _dense_loss_and_gradients(self, numerical, embeddings, label):
        """Compiled with XLA: loss and gradients w.r.t. ``embeddings`` and the MLP weights."""
        mlp = [v.value for v in self.mlp]
        # XLA compiles TensorFlow's own ops only, not tf_dlrm's kernels: this trace uses plain
        # TensorFlow ops, evaluation (not compiled) keeps the kernels.
        with tf.GradientTape() as tape, kernels_off():
            tape.watch(embeddings)
            tape.watch(mlp)
            loss = binary_cross_entropy(label, dense_forward(self.model, numerical, embeddings, training=True))
            scaled = self._scaled(loss)
        gradients = tape.gradient(scaled, [embeddings] + mlp)
        return loss, gradients[0], gradients[1:]

    def _gradients(self, x, y, sample_weight):
        if not self.jit_compile:
            return super()._gradients(x, y, sample_weight)
        tables = [v.value for v in self.shards + self.replicated + self.padding + self.hot]
        with tf.GradientTape() as tape:
            tape.watch(tables)
            # training=True: a dynamic table (tf_dlrm.embedding.dynamic) inserts new keys only in training.
            embeddings = self.model.embed(x, training=True)
        loss, embedding_gradient, mlp_gradients = self._dense_gradients(x[NUMERICAL_CHANNEL], embeddings, y)
        table_gradients = tape.gradient(embeddings, tables, output_gradients=embedding_gradient)
        return loss, None, table_gradients, mlp_gradients

    # ------------------------------------------------------------------ evaluation

    def _predict_step(self, features, label):
        """Click probabilities and labels of the global batch, in global order, on every rank: those of
        :meth:`_predict_local` (one graph for both, so the same float operations: TensorFlow may fuse the
        sigmoid into the last layer where the logits are not an output, which changes the last bits)."""
        rows = self._predict_local(features, label)
        return (
            collectives.allgather(self.env, rows[:, 0], name="eval_predictions"),
            collectives.allgather(self.env, tf.cast(tf.reshape(label, [-1]), rows.dtype), name="eval_labels"),
        )

    def _predict_local(self, features, label):
        """This rank's rows of the global batch: ``[rows, 3]`` float32 of (click probability, label, logit); the
        logit is what a calibration (:mod:`tf_dlrm.calibration`) is fitted on and applied to. The model's forward
        still runs collectively (the embedding exchange), the scores stay here."""
        logits = self.model(features, training=False)
        probabilities = tf.cast(tf.reshape(tf.sigmoid(logits), [-1]), tf.float32)
        return tf.stack([probabilities, tf.cast(tf.reshape(label, [-1]), tf.float32),
                         tf.cast(tf.reshape(logits, [-1]), tf.float32)], axis=1)

    def mean_over_ranks(self, value) -> float:
        """Collective: the mean of a scalar (the printed loss) over ranks; one small allreduce,
        called once per progress line, so ``-np 1`` and ``-np N`` logs compare line by line."""
        tensor = tf.reshape(tf.cast(value, tf.float32), [1])
        return float(collectives.grouped_mean(self.env, [tensor], name="mean_over_ranks")[0].numpy()[0])
