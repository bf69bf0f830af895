"""One training step for any Keras model holding tf_dlrm's distributed embeddings.

Gradients, with N ranks each computing the mean loss over its local batch:

- dense weights (anything unmarked) and replicated tables: averaged over ranks (allreduce), which
  gives the gradient of the global mean loss ``L = (1/N) sum_r loss_r``;
- embedding shards: the alltoall's backward already summed every rank's contribution, i.e.
  ``N * grad(L)``; they are scaled by ``1/N`` and stay sparse (``IndexedSlices``); each table's own
  optimizer updates the touched rows only (:mod:`tf_dlrm.embedding.sparse_update`);
- hot-row replicas: combined over ranks sparsely (touched rows only).

The step finds its variables by the kind marked on each (:mod:`tf_dlrm.embedding.variable_kind`),
never by the model's attribute names, so the same step trains DLRM, the model family and a user's
own model (:class:`tf_dlrm.embedding.Model` runs it inside ``fit``; a hand-written loop calls
:meth:`TrainingStep.__call__` inside its own ``tf.function``). Under float16 the loss is scaled
(:class:`LossScale`); a step whose gradients are not finite on any rank is skipped on every rank.
"""

from __future__ import annotations

import tensorflow as tf

from tf_dlrm.parallel import collectives
from tf_dlrm.parallel.compressed_mean import bfloat16_mean
from tf_dlrm.parallel.env import DistributedEnv
from tf_dlrm.embedding.hot_row_exchange import combine_hot_gradient
from tf_dlrm.embedding.hot_row_sync import HotRowSync
from tf_dlrm.embedding.sparse_update import SparseUpdater
from tf_dlrm.embedding.sublayers import sublayers
from tf_dlrm.embedding.variable_kind import VariableKind, variables_of_kind
from tf_dlrm.embedding.optimizers import DEFAULT_OPTIMIZER
from tf_dlrm.optimizers.sparse_optimizer import SparseOptimizer


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


def _values(gradient):
    return gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient


def _all_finite(gradients) -> tf.Tensor:
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(_values(g))) for g in gradients])


def binary_cross_entropy(label, logits):
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits))


def table_optimizer_groups(embeddings, default=None) -> tuple[SparseOptimizer | None, dict, float | None]:
    """``(base optimizer, {table: (optimizer, rate scale)}, base rate)`` from the table configs of the
    :class:`DistributedEmbedding` layers ``embeddings``; a table without an optimizer takes ``default``
    (an object of :mod:`tf_dlrm.embedding.optimizers`; None: its ``DEFAULT_OPTIMIZER``).

    The step's sparse update keeps one optimizer as the base (group 0, at the base rate, scale 1)
    and the others as per-table choices at ``their rate / base rate`` (scale 1 for a rate of None: the
    trainer's). The base is ``default`` when given (``main.py``: ``--embedding_optimizer``) and no table
    names another row-wise or dynamic-table optimizer, else the row-wise optimizer when a table has one
    (row-wise state is kept for the base only), else the one of the dynamic tables (their rows train
    with the base), else the most used. The base rate is None when the base's own rate is (the
    trainer's). Returns ``(None, {}, None)`` when no layer was made from table configs."""
    given = default
    default = DEFAULT_OPTIMIZER if default is None else default
    per_table = {}
    for layer in embeddings:
        chosen = layer.table_optimizers()
        if chosen is None:
            continue
        chosen = {t: default if o is None else o for t, o in chosen.items()}
        if per_table and chosen:
            if len({repr(o) for o in chosen.values()} | {repr(o) for o in per_table.values()}) > 1:
                raise ValueError("Expected one DistributedEmbedding per model when tables use different optimizers "
                                 "(table indices are per layer): put every feature in one layer")
        per_table.update(chosen)
    dynamic = {default if o is None else o for layer in embeddings for o in getattr(layer, "dynamic_optimizers", list)()}
    if not per_table and not dynamic:
        return None, {}, None
    row_wise = {o for o in list(per_table.values()) + list(dynamic) if o.make().row_wise}
    if len(row_wise) > 1:
        raise ValueError(f"Expected at most one row-wise optimizer setting per model. Received: {sorted(map(repr, row_wise))}")
    counts = {}
    for optimizer in per_table.values():
        counts[optimizer] = counts.get(optimizer, 0) + 1
    # Dynamic tables' rows (and rows that change keys) train with the base optimizer.
    if len(dynamic) > 1 or (dynamic and row_wise and dynamic != row_wise):
        raise ValueError("Expected one optimizer setting for every dynamic table (the base one, which a row-wise "
                         f"optimizer must be). Received: {sorted(map(repr, dynamic | row_wise))}")
    if given is not None and not (row_wise - {given}) and not (dynamic - {given}):
        base = given
    else:
        base = row_wise.pop() if row_wise else dynamic.pop() if dynamic else \
            max(counts, key=lambda o: (counts[o], -list(counts).index(o)))
    counts.setdefault(base, 0)

    def scale(optimizer) -> float:
        if optimizer.learning_rate is None or optimizer.learning_rate == base.learning_rate:
            return 1.0
        if base.learning_rate is None:
            raise ValueError(f"{optimizer!r} has a rate, but the base optimizer {base!r} takes the trainer's: give "
                             "both a learning_rate, or neither")
        return optimizer.learning_rate / base.learning_rate

    made = {o: (o.make(), scale(o)) for o in counts}
    overrides = {t: made[o] for t, o in per_table.items() if o != base}
    return made[base][0], overrides, None if base.learning_rate is None else float(base.learning_rate)


def frequency_regularizer_of(embeddings):
    """The one :class:`FrequencyRegularizer` of the tables of the layers ``embeddings``, or None
    (no table has one). The counts and the update are kept per variable, and a variable may hold
    slices of several tables: every table of the model takes the same setting."""
    settings = {r for layer in embeddings for r in getattr(layer, "frequency_regularizers", dict)().values()}
    if len(settings) > 1:
        raise ValueError("Expected one frequency_regularizer setting for every table of a model (or none). Received: "
                         f"{sorted(map(repr, settings))}")
    return settings.pop() if settings else None


def embedding_layers(model) -> list:
    """The layers of ``model`` that hold embedding tables (they report their table optimizers)."""
    return [layer for layer in sublayers(model) if hasattr(layer, "table_optimizers")]


def embedding_layer(model):
    """The one embedding layer of ``model`` (a checkpoint holds one layer's tables)."""
    layers = embedding_layers(model)
    if len(layers) != 1:
        raise ValueError(f"Expected one DistributedEmbedding in the model. Received: {len(layers)}")
    return layers[0]


class TrainingStep:
    """Trains ``model``'s marked variables: builds the optimizer state once, then each call is one step.

    Args:
        model: a built Keras model whose embedding layers mark their variables.
        env: this rank's place (every rank runs the same steps).
        loss_fn: ``(x, y, y_pred, sample_weight) -> scalar`` local mean loss.
        dense_optimizer: a Keras optimizer for the dense weights (built here on them only).
        sparse_optimizer: the embedding optimizer (group 0); None: from the layers' table configs.
        table_optimizers: ``{table: (optimizer, rate scale)}`` beside it (see :func:`table_optimizer_groups`).
        embedding_rate: the base rate of the embedding optimizer (a float or a scalar variable).
        embedding_weight_decay: L2 added to each touched row's gradient.
        loss_scale: float16 only: 0 dynamic, > 0 static (ignored under other policies).
        compress_dense_gradients: under mixed_bfloat16 with several ranks, average the dense
            gradients as bfloat16; ignored otherwise.
        hot_row_sync_every: with hot-row replicas and ``S > 1``, each rank updates its replicas with its
            own gradients and the ranks merge them every ``S`` steps; 1: combined every step (exact).
    """

    def __init__(self, model, env: DistributedEnv, loss_fn, dense_optimizer, sparse_optimizer: SparseOptimizer | None = None,
                 table_optimizers=None, embedding_rate=None, embedding_weight_decay: float = 0.0, loss_scale: float = 0.0,
                 compress_dense_gradients: bool = False, hot_row_sync_every: int = 1):
        self.model = model
        self.env = env
        self.loss_fn = loss_fn
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        trainable = model.trainable_variables
        self.shards = variables_of_kind(trainable, VariableKind.SHARDED)
        self.replicated = variables_of_kind(trainable, VariableKind.REPLICATED)
        self.mlp = variables_of_kind(trainable, VariableKind.DENSE)
        # Differentiated but never updated: they keep every rank's backward collectives alive.
        self.padding = variables_of_kind(model.non_trainable_variables, VariableKind.PADDING)
        # Hot-row replicas (tf_dlrm.embedding.hot_row_exchange): gradients combined sparsely over ranks.
        self.hot = variables_of_kind(trainable, VariableKind.HOT)
        # Bytes this rank sent in the hot-row gradients' allgathers since the start (rows + int32 slots).
        self.hot_gradient_bytes_sent = tf.Variable(0, dtype=tf.int64, trainable=False, name="hot_gradient_bytes_sent")
        if sparse_optimizer is None:
            sparse_optimizer, table_optimizers, base_rate = table_optimizer_groups(embedding_layers(model))
            if embedding_rate is None:
                embedding_rate = DEFAULT_OPTIMIZER.learning_rate if base_rate is None else base_rate
            if sparse_optimizer is None:
                raise ValueError("Expected a sparse_optimizer, or embedding layers made from TableConfig objects")
        self.embedding_rate = 1.0 if embedding_rate is None else embedding_rate
        regularizer = frequency_regularizer_of([layer for layer in sublayers(model) if hasattr(layer, "frequency_regularizers")])
        self.sparse = SparseUpdater(sparse_optimizer, env, self.shards, self.replicated, self.padding,
                                    weight_decay=embedding_weight_decay, table_optimizers=table_optimizers, hot=self.hot,
                                    frequency_regularizer=regularizer)
        # hot_row_sync_every > 1: local hot-row updates merged every S steps (None: combined every step).
        self.hot_sync = self.make_hot_row_sync(hot_row_sync_every) if hot_row_sync_every != 1 else None
        # Dynamic tables (tf_dlrm.embedding.dynamic) reset a row's optimizer state when they give it to a new key.
        for layer in sublayers(model):
            if hasattr(layer, "attach_optimizer_state"):
                layer.attach_optimizer_state(self.sparse)
        self.dense_optimizer = dense_optimizer
        if not self.dense_optimizer.built:
            self.dense_optimizer.build(self.mlp)
        # A stop request (SIGINT/SIGTERM, tf_dlrm.train.interrupt) rides on the gradient allreduce:
        # every rank sees the average of all ranks' requests after the same step, at no extra collective.
        self.stop_request = tf.Variable(0.0, trainable=False, name="stop_request")
        self.stop_agreed = tf.Variable(0.0, trainable=False, name="stop_agreed")
        # bfloat16 has float32's exponent range: only float16 needs its loss scaled.
        self.loss_scale = LossScale(loss_scale) if model.compute_dtype == "float16" else None
        # Opt-in: half the bytes of a float32 allreduce (tf_dlrm.parallel.compressed_mean), but two
        # collectives instead of one fused round. float32 gradients are never rounded to bfloat16 on
        # the wire: only mixed_bfloat16's are.
        self.compress_dense_gradients = bool(compress_dense_gradients) and env.distributed and model.compute_dtype == "bfloat16"

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

    def __call__(self, x, y, sample_weight=None):
        """One step on this rank's local batch ``(x, y)``; returns the local mean loss. Call it inside
        a ``tf.function`` (every rank the same number of times: it runs collectives)."""
        return self.train(x, y, sample_weight)[0]

    def _forward_loss(self, x, y, sample_weight):
        """``(loss, y_pred)`` of a forward pass in training mode (dynamic tables insert new keys only
        then, whether or not the model passes ``training`` down to its embedding layers)."""
        layers = embedding_layers(self.model)
        for layer in layers:
            layer.training_default = True
        try:
            y_pred = self.model(x, training=True)
        finally:
            for layer in layers:
                layer.training_default = None
        return self.loss_fn(x, y, y_pred, sample_weight), y_pred

    def _scaled(self, loss):
        return loss * self.loss_scale.scale if self.loss_scale is not None else loss

    def _gradients(self, x, y, sample_weight):
        """``(loss, y_pred, table gradients, dense gradients)``: shards + replicated + padding + hot,
        then dense weights, still scaled."""
        tables = [v.value for v in self.shards + self.replicated + self.padding + self.hot]
        mlp = [v.value for v in self.mlp]
        with tf.GradientTape() as tape:
            tape.watch(tables + mlp)
            loss, y_pred = self._forward_loss(x, y, sample_weight)
            scaled = self._scaled(loss)
        gradients = tape.gradient(scaled, tables + mlp)
        self._check_tables_reached(gradients[: len(self.shards) + len(self.replicated)])
        return loss, y_pred, gradients[: len(tables)], gradients[len(tables):]

    def _check_tables_reached(self, gradients) -> None:
        """Refuses, while the step is traced, a model whose loss does not depend on some of its tables
        (their gradient is None): the sparse update would fail on it far from the cause."""
        variables = self.shards + self.replicated
        missed = [v.name for v, g in zip(variables, gradients) if g is None]
        if missed:
            raise ValueError(
                f"{type(self.model).__qualname__}: the loss does not depend on its embedding tables (no gradient reaches "
                f"the variable(s) {missed}). Expected the model's output to use the embeddings it is given (in "
                f"dense_call). Received: {len(missed)} of {len(variables)} table variables without a gradient")

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

    def rates(self):
        """``(embedding base rate, dense rate or None)`` of this step (None: the dense optimizer's own)."""
        return self.embedding_rate, None

    def apply_dense(self, gradients, rate) -> None:
        """Updates the dense weights with their averaged gradients."""
        self.dense_optimizer.apply(gradients, self.mlp)

    def train(self, x, y, sample_weight=None):
        """One step; returns ``(local mean loss, y_pred)``."""
        loss, y_pred, table_grads, mlp_grads = self._gradients(x, y, sample_weight)
        count = len(self.shards)
        shard_grads = table_grads[:count]
        replicated_grads = [self.sparse.pack_replicated(g, v) for g, v in zip(table_grads[count:count + len(self.replicated)], self.replicated)]
        start = count + len(self.replicated)
        padding_grads = table_grads[start:start + len(self.padding)]
        # Summed over ranks (N times the global gradient, like a shard's), the same on every rank;
        # with --hot_row_sync_every > 1, this rank's own (merged later, tf_dlrm.embedding.hot_row_sync).
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
        embedding_rate, dense_rate = self.rates()
        local_batch = tf.shape(tf.nest.flatten(y)[0])[0]

        def apply():
            replicated = dense_grads[: len(self.replicated)]
            self.sparse.apply(shard_grads, replicated, embedding_rate, self.step + 1, local_batch * self.env.world_size,
                              hot_gradients=hot_grads)
            self.apply_dense(dense_grads[len(self.replicated):], dense_rate)
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
        return loss, y_pred

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

    def broadcast_initial_state(self) -> None:
        """Rank 0's dense weights to every rank (the shards are rank-local and need none)."""
        collectives.broadcast_variables(self.env, self.replicated + self.mlp)


def _scale(gradient, factor):
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values * tf.cast(factor, gradient.values.dtype), gradient.indices, gradient.dense_shape)
    return gradient * tf.cast(factor, gradient.dtype)
