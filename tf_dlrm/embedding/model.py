"""Model: a ``keras.Model`` whose ``compile()`` / ``fit()`` train distributed embeddings on N ranks.

``fit`` runs the library's training step (:class:`tf_dlrm.embedding.training_step.TrainingStep`),
the same one ``main.py`` runs: each table is updated by its own optimizer (its
:class:`~tf_dlrm.embedding.TableConfig`'s, touched rows only), replicated tables and dense weights
get gradients averaged over ranks, the compiled Keras optimizer updates the dense weights.

Under ``horovodrun`` every rank feeds its own slice of each global batch (the same number of
batches on every rank) and every rank must start from the same dense weights: seed Keras
identically on every rank, or pass :class:`BroadcastInitialState` to ``fit``. Tables need nothing:
their initial values depend only on the layer's seed.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from tf_dlrm.parallel import collectives
from tf_dlrm.parallel.env import current_env
from tf_dlrm.embedding.sublayers import sublayers
from tf_dlrm.embedding.training_step import TrainingStep
from tf_dlrm.embedding.variable_kind import VariableKind, variables_of_kind


def sharded_variables(model, kind: VariableKind = VariableKind.SHARDED) -> list:
    """The variables of ``model`` marked ``kind`` by its embedding layers (rank-local shards by default)."""
    return variables_of_kind(model.variables, kind)


def _first_batch(x):
    """A batch of ``x`` to build a model with (``fit``'s data: a dataset, a dict or an array)."""
    if isinstance(x, tf.data.Dataset):
        batch = next(iter(x))
        return batch[0] if isinstance(batch, tuple) else batch
    return tf.nest.map_structure(lambda a: a[:1], x)


class Model(keras.Model):
    """Subclass it (or call it functionally) like ``keras.Model``; embedding layers are found inside.

    Args:
        loss_scale: under ``mixed_float16``: 0 for a dynamic loss scale, > 0 for a static one.
        hot_row_sync_every: with hot-row tables on several ranks, merge the replicas' updates every
            ``S`` steps (1: combine every step, exact).
        env: this process's place; default Horovod's when initialised, else one process.
    """

    def __init__(self, *args, loss_scale: float = 0.0, hot_row_sync_every: int = 1, env=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._tf_dlrm_options = dict(loss_scale=loss_scale, hot_row_sync_every=hot_row_sync_every)
        self._tf_dlrm_env = env
        self._tf_dlrm_step = None

    def compile(self, optimizer="rmsprop", loss=None, **kwargs):
        # Horovod's collectives cannot be compiled by XLA: the whole step stays a TensorFlow graph.
        kwargs["jit_compile"] = False
        super().compile(optimizer=optimizer, loss=loss, **kwargs)
        self._tf_dlrm_step = None

    def build(self, input_shape=None):
        # Keras would build a subclassed model by a symbolic call, where the embedding's exchange
        # cannot run: the embedding layers are built here, the other layers by the first real call.
        for layer in sublayers(self):
            if hasattr(layer, "table_optimizers") and not layer.built:
                layer.build()
        self.built = True

    @property
    def input_modes(self) -> dict[str, str]:
        """``{feature name: "global" or "local"}`` of every embedding layer inside: the ids this rank's
        input must hold, for the global batch or for its local one (``main.py``'s readers read them so)."""
        modes = {}
        for layer in sublayers(self):
            modes.update(getattr(layer, "input_modes", {}) if hasattr(layer, "table_optimizers") else {})
        return modes

    @property
    def training_step(self) -> TrainingStep:
        """The training step (made on first use, after the model is built and compiled)."""
        if self._tf_dlrm_step is None:
            if not self.built:
                raise ValueError("Build the model (call it on a batch) before training it")
            optimizer = self.optimizer
            optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # our own loss scaling replaces Keras'
            self._tf_dlrm_step = TrainingStep(
                self, self._tf_dlrm_env or current_env(), loss_fn=self._loss_of, dense_optimizer=optimizer,
                compress_dense_gradients=False, **self._tf_dlrm_options)
        return self._tf_dlrm_step

    def _loss_of(self, x, y, y_pred, sample_weight):
        return self.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)

    def fit(self, x=None, y=None, *args, **kwargs):
        if not self.built:
            self(_first_batch(x))
        self.training_step  # noqa: B018 - state is made outside the traced train function
        return super().fit(x, y, *args, **kwargs)

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        loss, y_pred = self.training_step.train(x, y, sample_weight)
        # The loss fit() shows: this rank's local mean, as Keras' own train_step records it.
        loss_mean = self._loss_mean()
        if loss_mean is not None:
            loss_mean.update_state(loss, sample_weight=tf.shape(tf.nest.flatten(x)[0])[0])
        return self.compute_metrics(x, y, y_pred, sample_weight)

    def _loss_mean(self):
        """Keras' running mean of the loss (what ``fit`` logs as ``loss``), reached through the public
        ``metrics`` list, where a compiled model lists it first under the name ``loss``."""
        return next((metric for metric in self.metrics if metric.name == "loss"), None)


class BroadcastInitialState(keras.callbacks.Callback):
    """Gives every rank rank 0's dense weights when training begins (shards need nothing: their
    initial values depend only on the seed)."""

    def __init__(self, env=None):
        super().__init__()
        self.env = env

    def on_train_begin(self, logs=None):
        env = self.env or current_env()
        shard_ids = {id(v) for v in sharded_variables(self.model)}
        collectives.broadcast_variables(env, [v for v in self.model.variables if id(v) not in shard_ids and v.trainable])
