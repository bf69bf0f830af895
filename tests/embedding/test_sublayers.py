"""The layer walk the library uses instead of Keras internals alone, and the loss ``fit`` logs.

``sublayers`` must find an embedding layer at any depth (inside a plain ``keras.Layer``, which has no
public list of its children), and its fallback must find what Keras' own walk finds. ``fit`` must log the
mean training loss of the epoch (the model reaches Keras' loss tracker through the public ``metrics``
list): with a zero dense learning rate and a 1e-12 table rate (tables take positive rates only) the
weights move by about 1e-12, so that mean is the model's loss over the data to about 1e-12.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tf_dlrm.embedding import DistributedEmbedding, FeatureConfig, Model, TableConfig, optimizers
from tf_dlrm.embedding.sublayers import sublayers, walk_attributes

FROZEN = optimizers.SGD(learning_rate=1e-12)
TABLES = [TableConfig("users", 50, 4, optimizer=FROZEN), TableConfig("items", 30, 4, optimizer=FROZEN)]
FEATURES = [FeatureConfig("user", TABLES[0]), FeatureConfig("item", TABLES[1]),
            FeatureConfig("history", TABLES[1], hotness=3, combiner="mean")]


class Tower(keras.layers.Layer):
    """A plain layer (no ``layers`` list) holding the embedding and a list of dense layers."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.embedding = DistributedEmbedding(FEATURES, seed=3, name="embedding")
        self.stack = [keras.layers.Dense(6, name="hidden"), {"out": keras.layers.Dense(1, name="out")}]

    def call(self, inputs):
        pooled = self.embedding(inputs)
        joined = tf.concat([pooled[f.name] for f in FEATURES], axis=1)
        return self.stack[1]["out"](self.stack[0](joined))


class Nested(Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.tower = Tower(name="tower")

    def call(self, inputs):
        return self.tower(inputs)


def data(count=64, seed=0):
    rng = np.random.default_rng(seed)
    features = {"user": rng.integers(0, 50, count), "item": rng.integers(0, 30, count),
                "history": rng.integers(0, 30, (count, 3))}
    label = (rng.random((count, 1)) < 0.4).astype(np.float32)
    return {k: tf.constant(v, tf.int64) for k, v in features.items()}, tf.constant(label)


def test_sublayers_finds_the_embedding_inside_a_plain_layer():
    model = Nested()
    names = [layer.name for layer in sublayers(model)]
    assert "embedding" in names and "tower" in names


def test_the_attribute_walk_finds_what_keras_own_walk_finds():
    model = Nested()
    features, _ = data()
    model(features)
    keras_walk = {id(layer) for layer in model._flatten_layers(include_self=False)}
    ours = walk_attributes(model)
    assert len(ours) == len({id(layer) for layer in ours})  # each once
    assert {id(layer) for layer in ours} == keras_walk


def test_fit_logs_the_epoch_mean_loss():
    keras.utils.set_random_seed(1)
    model = Nested()
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    features, label = data()
    history = model.fit(tf.data.Dataset.from_tensor_slices((features, label)).batch(16), epochs=1, verbose=0, shuffle=False)
    logits = model(features)
    expected = float(keras.losses.BinaryCrossentropy(from_logits=True)(label, logits))
    assert abs(history.history["loss"][0] - expected) <= 1e-6 * max(1.0, abs(expected))
