"""ShardedModel: a ``keras.Model`` base class whose ``train_step`` trains sharded embeddings, so
``model.compile()`` / ``model.fit()`` work unchanged on N Horovod ranks.

One step on rank r of N, each rank holding the mean loss of its local batch:

- gradients of every dense weight (anything not a shard, replicated tables included) are averaged
  over ranks with one grouped allreduce: the gradient of the global mean loss; the compiled Keras
  optimizer applies them, so every rank keeps identical dense weights;
- gradients of the shards arrive through the alltoall's backward summed over ranks (N times the
  global gradient); they are scaled by 1/N and applied with sparse SGD to the touched rows only
  (duplicate ids accumulate), at ``embedding_learning_rate`` (default: the optimizer's rate).

Every rank must start from the same dense weights: seed Keras identically on every rank, or pass
:class:`BroadcastInitialState` to ``fit`` (rank 0's weights to all).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from tf_dlrm.parallel import collectives
from tf_dlrm.parallel.env import DistributedEnv
from tf_dlrm.embedding.variable_kind import VariableKind, variables_of_kind
from tf_dlrm.optimizers.sparse_sgd import SparseSGD


def sharded_variables(model, kind: VariableKind = VariableKind.SHARDED) -> list:
    """The rank-local shard variables of every sharded embedding layer inside ``model`` (or, with
    ``kind=VariableKind.PADDING``, the exchange paddings of ranks that own no slice), found by the
    mark each layer sets on its variables (:mod:`tf_dlrm.embedding.variable_kind`)."""
    return variables_of_kind(model.variables, kind)


def _dense_gradient(gradient, variable):
    if gradient is None:
        return tf.zeros(variable.shape, variable.dtype)
    if isinstance(gradient, tf.IndexedSlices):  # a replicated table: small, allreduced dense
        return tf.math.unsorted_segment_sum(gradient.values, gradient.indices, variable.shape[0])
    return gradient


class ShardedModel(keras.Model):
    """Subclass it (or call it functionally) like ``keras.Model``; sharded layers are found inside.

    Args:
        world_size, rank: this process's place (``tf_dlrm.parallel.env.initialize()``).
        embedding_learning_rate: the shards' SGD rate; None: the compiled optimizer's rate.
    """

    def __init__(self, *args, world_size: int = 1, rank: int = 0, embedding_learning_rate: float | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.env = DistributedEnv(rank=rank, world_size=world_size)
        self.embedding_learning_rate = embedding_learning_rate

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        shards = sharded_variables(self)
        shard_ids = {id(v) for v in shards}
        dense = [v for v in self.trainable_variables if id(v) not in shard_ids]
        padding = sharded_variables(self, VariableKind.PADDING)
        watched = [v.value for v in shards + dense + padding]
        with tf.GradientTape() as tape:
            tape.watch(watched)
            y_pred = self(x, training=True) if self._call_has_training_arg else self(x)
            loss = self._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
            # The loss shown by fit(): this rank's local mean, as Keras' own train_step records it.
            self._loss_tracker.update_state(loss, sample_weight=tf.shape(tf.nest.flatten(x)[0])[0])
        gradients = tape.gradient(loss, watched)
        count = len(shards) + len(dense)
        dense_gradients = [_dense_gradient(g, v) for g, v in zip(gradients[len(shards):count], dense)]
        dense_gradients = collectives.grouped_mean(self.env, dense_gradients, name=f"{self.name}_dense_gradients")
        rate = self.embedding_learning_rate
        if rate is None:
            rate = tf.cast(self.optimizer.learning_rate, tf.float32)
        for variable, gradient in zip(shards, gradients[:len(shards)]):
            if gradient is not None:
                SparseSGD.apply_repeated(variable, gradient, rate / self.env.world_size)
        self.optimizer.apply(dense_gradients, dense)
        # A rank owning no slice must still run the backward alltoall: storing the (zero) gradient
        # of its padding keeps it in the graph (see DistributedEmbedding.build).
        for variable, gradient in zip(padding, gradients[count:]):
            if gradient is not None:
                variable.assign(tf.cast(gradient, variable.dtype))
        return self.compute_metrics(x, y, y_pred, sample_weight)


class BroadcastInitialState(keras.callbacks.Callback):
    """Gives every rank rank 0's dense weights when training begins (shards need nothing: their
    initial values depend only on the seed)."""

    def __init__(self, env: DistributedEnv):
        super().__init__()
        self.env = env

    def on_train_begin(self, logs=None):
        shard_ids = {id(v) for v in sharded_variables(self.model)}
        collectives.broadcast_variables(self.env, [v for v in self.model.variables if id(v) not in shard_ids
                                                   and v.trainable])
