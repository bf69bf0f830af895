"""Two DistributedEmbedding layers in one Keras model, trained with model.fit on N ranks (or one process).

A two-tower model: the user tower's layer holds ``users`` (model-parallel) and ``devices`` (small,
replicated); the item tower's layer holds ``items`` (read by two features: the candidate, one-hot,
and a 4-id history, averaged) and ``brands``. Both layers run their own alltoalls in the same step:
their collective names come from the layer names, so they never mix.

Writes (rank 0) the global batch's logits before training, the full tables and the dense weights
after it, as JSON, for tests/embedding/test_two_layers.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tf_dlrm.parallel import collectives  # noqa: E402
from tf_dlrm.parallel.env import initialize  # noqa: E402
from tf_dlrm.embedding import (  # noqa: E402
    BroadcastInitialState, DistributedEmbedding, FeatureConfig, Model, TableConfig, optimizers, sharded_variables,
)

SGD = optimizers.SGD(learning_rate=0.2)
USER_TABLES = [TableConfig("users", 600, 8, optimizer=SGD), TableConfig("devices", 5, 8, optimizer=SGD, placement="replicated")]
USER_FEATURES = [FeatureConfig("user", USER_TABLES[0]), FeatureConfig("device", USER_TABLES[1])]
ITEM_TABLES = [TableConfig("items", 900, 8, optimizer=SGD), TableConfig("brands", 300, 6, optimizer=SGD)]
ITEM_FEATURES = [FeatureConfig("item", ITEM_TABLES[0]),
                 FeatureConfig("history", ITEM_TABLES[0], hotness=4, combiner="mean"),
                 FeatureConfig("brand", ITEM_TABLES[1])]
ALL_FEATURES = USER_FEATURES + ITEM_FEATURES


class TwoTowers(Model):
    """logit = <user tower, item tower> + bias."""

    def __init__(self, users: DistributedEmbedding, items: DistributedEmbedding, **kwargs):
        super().__init__(**kwargs)
        self.users, self.items = users, items
        self.user_tower = keras.layers.Dense(8, name="user_tower")
        self.item_tower = keras.layers.Dense(8, name="item_tower")
        self.bias = self.add_weight(name="bias", shape=(1,), initializer="zeros")

    def call(self, inputs):
        user = self.users({f.name: inputs[f.name] for f in USER_FEATURES})
        item = self.items({f.name: inputs[f.name] for f in ITEM_FEATURES})
        user_vector = self.user_tower(tf.concat([user["user"], user["device"]], axis=1))
        item_vector = self.item_tower(tf.concat([item["item"], item["history"], item["brand"]], axis=1))
        return tf.reduce_sum(user_vector * item_vector, axis=1, keepdims=True) + self.bias


def make_data(count: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    data = {
        "user": rng.integers(0, 600, count).astype(np.int32),
        "device": rng.integers(0, 5, count).astype(np.int32),
        "item": rng.integers(0, 900, count).astype(np.int32),
        "history": rng.integers(0, 40, (count, 4)).astype(np.int32),  # few ids: repeats in a sample
        "brand": rng.integers(0, 300, count).astype(np.int32),
    }
    score = np.sin(data["user"] * 0.05) * np.cos(data["item"] * 0.03) + 0.1 * (data["device"] - 2)
    data["label"] = (rng.random(count) < 1.0 / (1.0 + np.exp(-3.0 * score))).astype(np.float32)[:, None]
    return data


def local_rows(array: np.ndarray, global_batch: int, rank: int, world_size: int) -> np.ndarray:
    """Rank r's rows ``[r*b, (r+1)*b)`` of every global batch, in order."""
    local = global_batch // world_size
    batches = array.reshape((-1, global_batch) + array.shape[1:])
    return batches[:, rank * local:(rank + 1) * local].reshape((-1,) + array.shape[1:])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--global_batch", type=int, default=24)
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    env = initialize()
    keras.utils.set_random_seed(3)
    users = DistributedEmbedding(USER_FEATURES, seed=11, name="user_embedding")
    items = DistributedEmbedding(ITEM_FEATURES, seed=12, name="item_embedding")
    model = TwoTowers(users, items)
    model.compile(optimizer=keras.optimizers.SGD(0.2), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    data = make_data(args.steps * args.global_batch, seed=5)
    local = {name: local_rows(values, args.global_batch, env.rank, env.world_size) for name, values in data.items()}
    first = {f.name: tf.constant(local[f.name][: args.global_batch // env.world_size]) for f in ALL_FEATURES}
    model(first)  # builds every weight
    collectives.broadcast_variables(env, [v for v in model.trainable_variables
                                          if id(v) not in {id(s) for s in sharded_variables(model)}])
    # The global batch's logits before training, in global order (rank r holds rows [r*b, (r+1)*b)).
    logits = collectives.allgather(env, tf.function(model)(first), name="two_layers_logits").numpy()
    layers = ((users, USER_TABLES), (items, ITEM_TABLES))
    initial = {t.name: layer.get_full_table(t.name) for layer, configs in layers for t in configs}  # collective
    features = {f.name: local[f.name] for f in ALL_FEATURES}
    dataset = tf.data.Dataset.from_tensor_slices((features, local["label"])).batch(args.global_batch // env.world_size)
    model.fit(dataset, epochs=1, callbacks=[BroadcastInitialState()], verbose=0)
    tables = {t.name: layer.get_full_table(t.name) for layer, configs in layers for t in configs}  # collective
    if env.is_chief:
        shard_ids = {id(v) for v in users.trainable_variables + items.trainable_variables}
        dense = [v.numpy().tolist() for v in model.trainable_variables if id(v) not in shard_ids]
        with open(args.output, "w") as handle:
            moved = {k: float(np.abs(tables[k] - initial[k]).max()) for k in tables}
            json.dump({"logits": logits.tolist(), "tables": {k: v.tolist() for k, v in tables.items()}, "dense": dense,
                       "moved": moved}, handle)


if __name__ == "__main__":
    main()
