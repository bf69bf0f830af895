"""A model of the library whose tables are all dynamic (no fixed table, no plan) trains with fit, and
its checkpoint restores into a fresh model: the same predictions, the same key -> row maps."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tf_dlrm.checkpoint import model_checkpoint
from tf_dlrm.embedding import DistributedEmbedding, DynamicStorage, FeatureConfig, Model, Placement, TableConfig, optimizers


class Clicks(Model):
    def __init__(self, embedding, **kwargs):
        super().__init__(**kwargs)
        self.embedding = embedding
        self.head = keras.layers.Dense(1)

    def call(self, inputs):
        pooled = self.embedding({"user": inputs["user"], "item": inputs["item"]})
        return self.head(tf.concat([pooled["user"], pooled["item"]], axis=1))


def make_model() -> Clicks:
    adagrad = optimizers.Adagrad(learning_rate=0.1)  # dynamic tables share one optimizer setting
    users = TableConfig("users", 64, 4, optimizer=adagrad, placement=Placement(dynamic=DynamicStorage(capacity=64)))
    items = TableConfig("items", 64, 4, optimizer=adagrad, placement=Placement(dynamic=DynamicStorage(capacity=32, eviction="lru")))
    model = Clicks(DistributedEmbedding([FeatureConfig("user", users), FeatureConfig("item", items)], seed=3))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    return model


def test_all_dynamic_model_fits_saves_and_restores(tmp_path):
    rng = np.random.default_rng(0)
    data = {"user": rng.integers(-10**15, 10**15, 16)[rng.integers(0, 16, 256)].astype(np.int64),
            "item": rng.integers(0, 40, 256).astype(np.int64) * 7919}
    labels = (data["item"] % 3 == 0).astype(np.float32)[:, None]
    model = make_model()
    assert model.embedding.dynamic_only and model.embedding.plan is None
    model.fit(data, labels, batch_size=32, epochs=2, verbose=0, shuffle=False)
    trained = model.predict(data, batch_size=64, verbose=0)
    path = model_checkpoint.save(model, str(tmp_path / "ckpt"))
    fresh = make_model()
    fresh.fit({k: v[:32] for k, v in data.items()}, labels[:32], batch_size=32, epochs=1, verbose=0)  # other state
    assert model_checkpoint.restore(fresh, path) == int(model.training_step.step.numpy())
    np.testing.assert_array_equal(fresh.predict(data, batch_size=64, verbose=0), trained)
    assert fresh.embedding.dynamic_layer.counters()["items"]["rows"] == 32  # 40 item keys, capacity 32
