"""SavedModel of a model on dynamic tables: serving takes raw int64 keys.

The exported module carries each table's key -> row map (``MutableHashTable``, saved with its
contents) and row storage, so ``tf.saved_model.load`` alone serves it (no tf_dlrm, no Horovod)::

    served = tf.saved_model.load(DIR)
    served.signatures["serving_default"](numerical=..., categorical=...)["probability"]

``categorical`` is int64 ``[batch, tables]`` of raw keys (columns in feature-spec order); a key the
tables never saw reads zeros, as in evaluation. Export from one process holding every shard: restore
an N-rank checkpoint (:mod:`tf_dlrm.checkpoint.dynamic_tables`) into a model built with ``world_size=1``
(every key is re-routed to it), then export. This lives apart from :mod:`tf_dlrm.cli.export`
(fixed tables); here the Keras forward pass is traced as is. ``main.py --mode=export`` builds the
one-process model with the checkpoint's shard count (:func:`tf_dlrm.cli.export.dynamic_serving`).
"""

from __future__ import annotations

import tensorflow as tf

from tf_dlrm.embedding.serving import checked_batch


class DynamicServing(tf.Module):
    """Args:
        model: a built model whose embedding is a one-process :class:`DynamicEmbedding`, or a
            ``DistributedEmbedding`` of dynamic tables only (it holds one).
        numerical_features, categorical_features: the inputs' column names, named when a served batch
            has another width (default ``num_<i>`` and ``table <i>``); raw keys have no range to check.
    """

    def __init__(self, model, numerical_features=None, categorical_features=None):
        super().__init__()
        embedding = getattr(model.embedding, "dynamic_layer", None) or model.embedding
        if embedding.env.world_size != 1:
            raise ValueError("Expected a one-process model to export (restore the checkpoint with world_size=1 first). "
                             f"Received: world_size={embedding.env.world_size}")
        # The Keras model is not tracked itself (saving would trace Keras' own default signature
        # with float inputs); what the traced forward pass reads is tracked instead: the weights,
        # each table's key map (saved with its contents) and the row metadata.
        self._forward = lambda inputs: model(inputs, training=False)
        self.weights = [v.value if hasattr(v, "value") else v for v in model.variables]
        states = [state for shard in embedding.local_shards for state in embedding.states[shard]]
        self.key_maps = [state.map for state in states]
        self.row_metadata = [v for state in states for v in (state.occupied, state.row_key)]
        self.num_numerical = model.num_numerical
        self.num_tables = len(embedding.table_configs)
        self.names = [f.name for f in model.embedding.features]  # the model's inputs, one per table
        self.numerical_features = list(numerical_features or [f"num_{i}" for i in range(self.num_numerical)])
        self.categorical_features = list(categorical_features or [f"table {t}" for t in range(self.num_tables)])
        self.serve = tf.function(self._serve, input_signature=[
            tf.TensorSpec([None, self.num_numerical], tf.float32, name="numerical"),
            tf.TensorSpec([None, self.num_tables], tf.int64, name="categorical"),
        ])

    def _serve(self, numerical, categorical):
        numerical, categorical = checked_batch(numerical, categorical, self.numerical_features, self.categorical_features)
        keys = {name: categorical[:, t] for t, name in enumerate(self.names)}
        logits = self._forward({"numerical": numerical, **keys})
        return {"probability": tf.reshape(tf.sigmoid(logits), [-1])}


def export(model, directory: str) -> None:
    """Writes the SavedModel of ``model`` to ``directory``."""
    from tf_dlrm.ops import kernels_off

    module = DynamicServing(model)
    with kernels_off():  # plain TF ops only: serving needs no tf_dlrm kernel library
        tf.saved_model.save(module, directory, signatures={"serving_default": module.serve})
