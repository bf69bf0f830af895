"""What the models of the family share: the trainer's interface around one sharded embedding.

The trainer (:class:`tf_dlrm.train.step.Trainer`) calls ``model((numerical, categorical))``, and on
the XLA path ``model.embedding(categorical, local_batch=...)`` then ``model.dense_call(numerical,
embeddings)``; it sorts weights by their marks, so a model needs no trainer code of its own.
"""

from __future__ import annotations

import keras
import tensorflow as tf


class FamilyModel(keras.Model):
    """Base of DCNv2, DeepFM and Wide & Deep: ``(numerical [b, n], categorical tuple) -> logits [b, 1]``.

    Args:
        embedding: a built-on-first-call :class:`DistributedEmbedding` (or subclass); its first
            ``num_deep_features`` features are the deep embeddings, any after them width-1 weights.
        num_numerical: numerical features per sample.
        num_deep_features: categorical columns (one deep table each).
        seed: base seed of the dense initialisers.
    """

    def __init__(self, embedding, num_numerical: int, num_deep_features: int, seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        if int(num_deep_features) < 1:
            raise ValueError(f"Expected at least one categorical feature. Received: num_deep_features={num_deep_features}")
        self.embedding = embedding
        self.num_numerical = int(num_numerical)
        self.num_deep_features = int(num_deep_features)
        self.seed = int(seed)
        widths = list(embedding.feature_widths)
        self.deep_width = sum(widths[:self.num_deep_features])
        self.extra_width = sum(widths[self.num_deep_features:])

    def build(self, input_shape=None):
        """Builds the embedding and the dense layers from their widths, as :meth:`DLRM.build`: Keras's
        default build traces ``call`` symbolically, where the embedding's exchange cannot run."""
        if not self.embedding.built:
            self.embedding.build(None)
        self.build_dense((None, self.num_numerical + self.deep_width))

    def build_dense(self, x0_shape):  # pragma: no cover - every model defines it
        """Builds the layers after the embedding; ``x0_shape``: the deep input's, ``[b, numerical + deep widths]``."""
        raise NotImplementedError

    def call(self, inputs, training=False):
        numerical, categorical = inputs
        embeddings = self.embedding(categorical, local_batch=tf.shape(numerical)[0])
        return self.dense_call(numerical, embeddings)

    def split_embeddings(self, embeddings):
        """``(deep [b, sum of deep widths], extra [b, number of width-1 features])`` in compute dtype."""
        flat = tf.reshape(tf.cast(embeddings, self.compute_dtype), [-1, self.deep_width + self.extra_width])
        if not self.extra_width:
            # No slice at all: a slice's gradient (StridedSliceGrad) writes a zeroed copy of the whole block.
            return flat, flat[:, :0]
        # One split: its gradient is one concat, where two slices' gradients are two zeroed full copies.
        deep, extra = tf.split(flat, [self.deep_width, self.extra_width], axis=1)
        return deep, extra

    def deep_input(self, numerical, deep):
        """The deep MLP's (and DCNv2's ``x0``) input: numerical features next to the embeddings."""
        return tf.concat([tf.cast(numerical, self.compute_dtype), deep], axis=1)

    def dense_call(self, numerical, embeddings):  # pragma: no cover - every model defines it
        raise NotImplementedError

    def get_config(self):
        return {**super().get_config(), "embedding": keras.saving.serialize_keras_object(self.embedding),
                "num_numerical": self.num_numerical, "num_deep_features": self.num_deep_features, "seed": self.seed}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["embedding"] = keras.saving.deserialize_keras_object(config["embedding"])
        return cls(**config)
