"""The training and evaluation steps of any model on the sharded embedding, as tf.functions.

Gradients, with N ranks each computing the mean loss over its local batch:

- MLP and replicated-table gradients: averaged over ranks with one grouped allreduce, which gives
  the gradient of the global mean loss ``L = (1/N) sum_r loss_r``;
- embedding shards: the alltoall's backward already summed every rank's contribution, i.e.
  ``N * grad(L)``; they are scaled by ``1/N`` and stay sparse (``IndexedSlices``); the embedding
  optimizer updates the touched rows only (:mod:`tf_dlrm.train.sparse_update`).

The trainer finds its variables by the kind marked on each (:mod:`tf_dlrm.model.variable_kind`),
not by the model's attribute names. Embeddings train with a sparse optimizer (``sgd``, ``adagrad``,
``rowwise_adagrad``, ``lazy_adam``), the MLPs with ``sgd``, ``adam``, ``adagrad`` or ``lamb`` on the
averaged gradient; one learning-rate schedule drives both, each family at its own base rate.

With ``jit_compile`` the step is cut in three: the embedding lookup and exchange (Horovod ops,
never compiled) under a tape; one XLA-compiled function computing the loss and the gradients of
the dense part with respect to the MLP weights and to the exchanged embeddings; then the backward
of the exchange (the alltoall's registered gradient) from those embedding gradients.
"""

from __future__ import annotations

import os

import keras
import tensorflow as tf

from tf_dlrm.distributed import collectives
from tf_dlrm.distributed.compressed_mean import bfloat16_mean
from tf_dlrm.distributed.env import DistributedEnv
from tf_dlrm.distributed.hot_row_exchange import combine_hot_gradient
from tf_dlrm.model.variable_kind import VariableKind, variables_of_kind
from tf_dlrm.ops import kernels_off
from tf_dlrm.optimizers.config import OPTIMIZERS, OptimizerConfig, make_dense_optimizer, make_sparse_optimizer  # noqa: F401
from tf_dlrm.train.hot_row_sync import HotRowSync
from tf_dlrm.train.sparse_update import SparseUpdater

class LossScale:
    """Loss scaling of float16 training: the loss is multiplied by ``S`` before the backward pass so
    that small gradients do not flush to zero in float16, and gradients are divided by ``S`` after.

    Static (``initial > 0``): ``S`` never changes. Dynamic (``initial == 0``): ``S`` starts at
    ``2**15``; a step whose gradients hold an inf or NaN on any rank is skipped and halves ``S``;
    after ``growth_interval`` finite steps in a row ``S`` doubles (the scheme of
    ``keras.optimizers.LossScaleOptimizer``).
    """

    INITIAL_DYNAMIC = 2.0**15
    GROWTH_INTERVAL = 2000

    def __init__(self, initial: float):
        self.dynamic = initial == 0
        self.scale = tf.Variable(self.INITIAL_DYNAMIC if self.dynamic else float(initial), dtype=tf.float32,
                                 trainable=False, name="loss_scale")
        self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="loss_scale_good_steps")

    def update(self, finite: tf.Tensor) -> None:
        """After a step: grow after enough finite steps, shrink (and restart counting) on overflow."""
        if not self.dynamic:
            return
        grown = self.good_steps + 1 >= self.GROWTH_INTERVAL
        self.scale.assign(tf.where(finite, tf.where(grown, self.scale * 2.0, self.scale), tf.maximum(self.scale / 2.0, 1.0)))
        self.good_steps.assign(tf.where(finite & ~grown, self.good_steps + 1, tf.zeros_like(self.good_steps)))


def prefer_legacy_xla_cpu_runtime() -> None:
    """Asks XLA:CPU for its classic runtime, unless ``XLA_FLAGS`` already chooses.

    On TF 2.18 the default "thunk" runtime of XLA:CPU ran the compiled dense step of DLRM about 10%
    slower than the classic one (benchmarks/train_throughput.py, case ``tf_dlrm_xla``). XLA reads
    ``XLA_FLAGS`` at its first compilation in the process; later changes are ignored.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_use_thunk_runtime" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_use_thunk_runtime=false".strip()


def _values(gradient):
    return gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient


def _all_finite(gradients) -> tf.Tensor:
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(_values(g))) for g in gradients])


def binary_cross_entropy(label, logits):
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits))


class Trainer:
    """Owns the optimizer state and the step counter; builds the tf.functions once.

    Args:
        model: a built :class:`tf_dlrm.models.ranking_model.RankingModel`.
        env: this rank's place.
        config: optimizer settings.
        jit_compile: compile the forward/backward of the dense part with XLA. The Horovod
            collectives, the embedding lookups and the sparse updates stay outside the compiled
            function.
        compress_dense_gradients: under mixed_bfloat16 with several ranks, average the MLP gradients
            as bfloat16 (``--bf16_dense_allreduce``); ignored otherwise.
        hot_row_sync_every: ``S`` of ``--hot_row_sync_every``: with hot-row replicas and ``S > 1``,
            each rank updates its replicas with its own gradients and the ranks merge them every
            ``S`` steps (:mod:`tf_dlrm.train.hot_row_sync`); 1: combined every step (exact).
    """

    def __init__(self, model, env: DistributedEnv, config: OptimizerConfig, jit_compile: bool = False,
                 compress_dense_gradients: bool = False, hot_row_sync_every: int = 1):
        self.model = model
        self.env = env
        self.config = config
        self.jit_compile = bool(jit_compile)
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        trainable = model.trainable_variables
        self.shards = variables_of_kind(trainable, VariableKind.SHARDED)
        self.replicated = variables_of_kind(trainable, VariableKind.REPLICATED)
        self.mlp = variables_of_kind(trainable, VariableKind.DENSE)
        # Differentiated but never updated: they keep every rank's backward collectives alive.
        self.padding = variables_of_kind(model.non_trainable_variables, VariableKind.PADDING)
        # Hot-row replicas (tf_dlrm.distributed.hot_row_exchange): gradients combined sparsely over ranks.
        self.hot = variables_of_kind(trainable, VariableKind.HOT)
        # Bytes this rank sent in the hot-row gradients' allgathers since the start (rows + int32 slots).
        self.hot_gradient_bytes_sent = tf.Variable(0, dtype=tf.int64, trainable=False, name="hot_gradient_bytes_sent")
        self.sparse = SparseUpdater(make_sparse_optimizer(config), env, self.shards, self.replicated, self.padding,
                                    weight_decay=config.embedding_weight_decay, table_optimizers=_table_optimizers(model, config),
                                    hot=self.hot)
        # --hot_row_sync_every > 1: local hot-row updates merged every S steps (None: combined every step).
        self.hot_sync = self.make_hot_row_sync(hot_row_sync_every) if hot_row_sync_every != 1 else None
        # Dynamic tables (tf_dlrm.dynamic) reset a row's optimizer state when they give it to a new key.
        for layer in model._flatten_layers(include_self=False):
            if hasattr(layer, "attach_optimizer_state"):
                layer.attach_optimizer_state(self.sparse)
        self.dense_optimizer = make_dense_optimizer(config)
        self.dense_optimizer.build(self.mlp)
        self.learning_rate = tf.Variable(config.schedule.base, dtype=tf.float32, trainable=False, name="learning_rate")
        # A stop request (SIGINT/SIGTERM, tf_dlrm.train.interrupt) rides on the gradient allreduce:
        # every rank sees the average of all ranks' requests after the same step, at no extra collective.
        self.stop_request = tf.Variable(0.0, trainable=False, name="stop_request")
        self.stop_agreed = tf.Variable(0.0, trainable=False, name="stop_agreed")
        # bfloat16 has float32's exponent range: only float16 needs its loss scaled.
        self.loss_scale = LossScale(config.loss_scale) if model.compute_dtype == "float16" else None
        # Opt-in: half the bytes of a float32 allreduce (tf_dlrm.distributed.compressed_mean), but two
        # collectives instead of one fused round, which measured slower over Gloo's loopback (README).
        # float32 gradients are never rounded to bfloat16 on the wire: only mixed_bfloat16's are.
        self.compress_dense_gradients = bool(compress_dense_gradients) and env.distributed and model.compute_dtype == "bfloat16"
        self.train_step = tf.function(self._train_step, reduce_retracing=True, autograph=False)
        self.predict_step = tf.function(self._predict_step, reduce_retracing=True, autograph=False)
        if self.jit_compile:
            prefer_legacy_xla_cpu_runtime()
            self._dense_gradients = tf.function(self._dense_loss_and_gradients, jit_compile=True, reduce_retracing=True, autograph=False)

    def make_hot_row_sync(self, every: int) -> HotRowSync | None:
        """The merges of this trainer's hot-row replicas every ``every`` steps (None: no replicas).
        ``every == 1`` is the exact combine in training; tests make a ``HotRowSync(every=1)`` with this
        (before the first step) to check that merging after every step equals it for SGD."""
        if not (self.hot and self.env.distributed):
            return None
        # Every state variable of each replica (all optimizer groups), in the same order on every rank.
        states = [[slots[group][name] for group in sorted(slots) for name in sorted(slots[group])] for slots in self.sparse.hot_slots]
        return HotRowSync(self.env, every, self.hot, states, self.hot_gradient_bytes_sent)

    def allreduce_payload_bytes(self) -> int:
        """Bytes of what :meth:`_average_over_ranks` averages each step: the replicated tables'
        packed gradients (a count column with a stateful optimizer), the MLP gradients and the
        scalars riding along (stop request, finite flag)."""
        extra = 0 if self.sparse.plain_sgd else 1
        replicated = sum(int(v.shape[0]) * (int(v.shape[1]) + extra) * 4 for v in self.replicated)
        mlp = sum(int(v.shape.num_elements()) * tf.as_dtype(v.dtype).size for v in self.mlp)
        if self.compress_dense_gradients:  # bfloat16 on the wire: half the float32 bytes
            mlp = mlp // 2
        scalars = 4 * (int(self.env.distributed) + int(self.loss_scale is not None and self.loss_scale.dynamic))
        return replicated + mlp + scalars

    # ------------------------------------------------------------------ training

    def _loss(self, numerical, categorical, label):
        return binary_cross_entropy(label, self.model((numerical, categorical), training=True))

    def _scaled(self, loss):
        return loss * self.loss_scale.scale if self.loss_scale is not None else loss

    def _dense_loss_and_gradients(self, numerical, embeddings, label):
        """Compiled with XLA: loss and gradients w.r.t. ``embeddings`` and the MLP weights."""
        mlp = [v.value for v in self.mlp]
        # XLA compiles TensorFlow's own ops only, not tf_dlrm's kernels: this trace uses plain
        # TensorFlow ops, evaluation (not compiled) keeps the kernels.
        with tf.GradientTape() as tape, kernels_off():
            tape.watch(embeddings)
            tape.watch(mlp)
            loss = binary_cross_entropy(label, self.model.dense_call(numerical, embeddings))
            scaled = self._scaled(loss)
        gradients = tape.gradient(scaled, [embeddings] + mlp)
        return loss, gradients[0], gradients[1:]

    def _gradients(self, numerical, categorical, label):
        """Loss and gradients (still scaled) of shards + replicated + padding + hot, then MLP weights."""
        tables = [v.value for v in self.shards + self.replicated + self.padding + self.hot]
        mlp = [v.value for v in self.mlp]
        if not self.jit_compile:
            with tf.GradientTape() as tape:
                tape.watch(tables + mlp)
                loss = self._loss(numerical, categorical, label)
                scaled = self._scaled(loss)
            gradients = tape.gradient(scaled, tables + mlp)
            return loss, gradients[: len(tables)], gradients[len(tables):]
        with tf.GradientTape() as tape:
            tape.watch(tables)
            # training=True: a dynamic table (tf_dlrm.dynamic) inserts new keys only in training.
            embeddings = self.model.embedding(categorical, local_batch=tf.shape(numerical)[0], training=True)
        loss, embedding_gradient, mlp_gradients = self._dense_gradients(numerical, embeddings, label)
        table_gradients = tape.gradient(embeddings, tables, output_gradients=embedding_gradient)
        return loss, table_gradients, mlp_gradients

    def _average_over_ranks(self, gradients: list) -> list:
        """One allreduce per gradient rather than one group: each starts as soon as the backward
        pass has produced it (top MLP first), so the exchange overlaps the rest of the backward
        pass; Horovod still fuses the ones that are ready together. Faster at ``-np 2`` on one
        machine (benchmarks/scaling.py); every rank issues the same names, Horovod matches them."""
        if not self.env.distributed:
            return list(gradients)
        gradients = list(gradients)
        compressed = {}
        if self.compress_dense_gradients:
            # The MLP gradients only: replicated tables' counts and the stop/finite flags stay exact.
            start = len(self.replicated)
            positions = range(start, start + len(self.mlp))
            compressed = dict(zip(positions, bfloat16_mean(self.env, [gradients[i] for i in positions], "dense_gradients_bf16")))
        return [compressed[i] if i in compressed else collectives.grouped_mean(self.env, [g], name=f"dense_gradient_{i}")[0]
                for i, g in enumerate(gradients)]

    def _train_step(self, numerical, categorical, label):
        loss, table_grads, mlp_grads = self._gradients(numerical, categorical, label)
        count = len(self.shards)
        shard_grads = table_grads[:count]
        replicated_grads = [self.sparse.pack_replicated(g, v) for g, v in zip(table_grads[count:count + len(self.replicated)], self.replicated)]
        start = count + len(self.replicated)
        padding_grads = table_grads[start:start + len(self.padding)]
        # Summed over ranks (N times the global gradient, like a shard's), the same on every rank;
        # with --hot_row_sync_every > 1, this rank's own (merged later, tf_dlrm.train.hot_row_sync).
        hot_grads, sent = [], []
        for i, (g, v) in enumerate(zip(table_grads[start + len(self.padding):], self.hot)):
            if self.hot_sync is not None:
                hot_grads.append(self.hot_sync.local_gradient(i, g))
                continue
            rows, summed, mine = combine_hot_gradient(self.env, g, int(v.shape[0]), name=f"hot_gradient_{i}")
            hot_grads.append((rows, summed))
            sent.append(tf.cast(mine, tf.int64) * (int(v.shape[1]) * 4 + 4) * (self.env.world_size - 1))
        if sent:
            self.hot_gradient_bytes_sent.assign_add(tf.add_n(sent))
        dense_grads = replicated_grads + list(mlp_grads)
        finite = None
        if self.loss_scale is not None:
            inverse = 1.0 / self.loss_scale.scale
            shard_grads = [_scale(g, inverse) for g in shard_grads]
            dense_grads = [g * tf.cast(inverse, g.dtype) for g in dense_grads]
            hot_grads = [(rows, summed * tf.cast(inverse, summed.dtype)) for rows, summed in hot_grads]
            if self.loss_scale.dynamic:
                # Every rank must skip the same steps: the finite flag is averaged with the gradients.
                dense_grads.append(tf.cast(_all_finite(shard_grads + dense_grads + [s for _, s in hot_grads]), tf.float32))
        if self.env.distributed:
            dense_grads.append(self.stop_request.value())
        dense_grads = self._average_over_ranks(dense_grads)
        if self.env.distributed:
            self.stop_agreed.assign(dense_grads.pop())
        if self.loss_scale is not None and self.loss_scale.dynamic:
            finite = tf.equal(dense_grads.pop(), 1.0)
        rate = self.config.schedule.tensor(self.step)
        self.learning_rate.assign(rate)

        def apply():
            replicated = dense_grads[: len(self.replicated)]
            self.sparse.apply(shard_grads, replicated, rate * self.config.embedding_rate_factor, self.step + 1,
                              tf.shape(numerical)[0] * self.env.world_size, hot_gradients=hot_grads)
            mlp_grads = dense_grads[len(self.replicated):]
            decay = self.config.dense_weight_decay
            if decay and self.config.optimizer != "lamb":  # LAMB decays inside its trust ratio
                mlp_grads = [g + tf.cast(decay, g.dtype) * tf.cast(v.value, g.dtype) for g, v in zip(mlp_grads, self.mlp)]
            dense_rate = rate * self.config.dense_rate_factor
            if self.config.optimizer == "sgd":
                # Keras' SGD is a multiply and a subtract per weight; the fused kernel does both in one pass.
                for variable, gradient in zip(self.mlp, mlp_grads):
                    tf.raw_ops.ResourceApplyGradientDescent(var=variable.value.handle, alpha=tf.cast(dense_rate, gradient.dtype), delta=gradient)
                self.dense_optimizer.iterations.assign_add(1)
            else:
                self.dense_optimizer.learning_rate = dense_rate
                self.dense_optimizer.apply(mlp_grads, self.mlp)
            return tf.constant(True)

        if finite is None:
            apply()
        else:
            tf.cond(finite, apply, lambda: tf.constant(False))
            self.loss_scale.update(finite)
        # Grappler prunes results nobody reads, and a control dependency is not enough to keep
        # them: storing the padding gradient (exactly zero, receivers skip that column) keeps this
        # rank's backward alltoall in the graph, as on every other rank.
        for variable, gradient in zip(self.padding, padding_grads):
            variable.assign(tf.cast(gradient, variable.dtype))
        self.step.assign_add(1)
        if self.hot_sync is not None:
            self.hot_sync.after_step()  # merges every S-th step (collective, the same step on every rank)
        return loss

    def synchronize_hot_rows(self) -> None:
        """Collective: merges the hot-row replicas' pending local updates (``--hot_row_sync_every > 1``),
        so every rank holds the same replicas; called before anything reads the tables."""
        if self.hot_sync is not None:
            self.hot_sync.synchronize()

    def hot_rows_written(self) -> None:
        """The replicas (or their state) were written from outside, identically on every rank
        (a checkpoint restored, a kept state put back): they are the merged state now."""
        if self.hot_sync is not None:
            self.hot_sync.rebase()

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

    def mean_over_ranks(self, value) -> float:
        """Collective: the mean of a scalar (the printed loss) over ranks; one small allreduce,
        called once per progress line, so ``-np 1`` and ``-np N`` logs compare line by line."""
        tensor = tf.reshape(tf.cast(value, tf.float32), [1])
        return float(collectives.grouped_mean(self.env, [tensor], name="mean_over_ranks")[0].numpy()[0])

    def broadcast_initial_state(self) -> None:
        """Rank 0's dense weights to every rank (the shards are rank-local and need none)."""
        collectives.broadcast_variables(self.env, self.replicated + self.mlp)


def _table_optimizers(model, config: OptimizerConfig) -> dict:
    """``{table: (sparse optimizer, rate scale)}`` for tables a model trains with another optimizer
    than the embedding one (Wide & Deep's ``--wide_optimizer``), rates relative to the embedding rate."""
    import dataclasses

    choices = model.table_optimizer_choices()
    embedding_rate = config.embedding_learning_rate or config.schedule.base
    # One optimizer object per (name, rate): tables sharing it may share a fused variable.
    made = {choice: (make_sparse_optimizer(dataclasses.replace(config, embedding_optimizer=choice[0])),
                     choice[1] / embedding_rate if choice[1] else 1.0) for choice in set(choices.values())}
    return {table: made[choice] for table, choice in choices.items()}


def _scale(gradient, factor):
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values * tf.cast(factor, gradient.values.dtype), gradient.indices, gradient.dense_shape)
    return gradient * tf.cast(factor, gradient.dtype)
