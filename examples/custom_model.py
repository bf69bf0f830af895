"""A DeepFM-like model on tf_dlrm's distributed embedding, trained with Keras' own compile() / fit().

Tables and features: ``items`` is read by two features (the candidate ``item``, one-hot, and the
user's ``history``, 5 ids averaged); ``devices`` is small and replicated on every rank. Each table
has its own optimizer (plain SGD here, at the script's rate). The model
adds an FM part (pairwise dot products of the width-8 vectors), a deep part (an MLP on everything)
and a wide part (a dense weight on the numerical features, outside any MLP).

Run it in one process, or on N ranks (each rank trains on its slice of every global batch; the
result equals one process with the same global batch)::

    python examples/custom_model.py --steps=30
    horovodrun -np 2 -H localhost:2 --gloo python examples/custom_model.py --steps=30

``--output=FILE`` writes the final weights and losses as JSON (rank 0), for the test that checks
N ranks against one process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tf_dlrm.embedding.table_init import initial_table_slice  # noqa: E402
from tf_dlrm.embedding import (  # noqa: E402
    BroadcastInitialState, DistributedEmbedding, FeatureConfig, Model, TableConfig, initialize, optimizers,
)

NUM_DENSE = 3


def make_features(learning_rate: float) -> list[FeatureConfig]:
    sgd = optimizers.SGD(learning_rate=learning_rate)
    users = TableConfig("users", 1000, 8, optimizer=sgd)
    items = TableConfig("items", 2000, 8, optimizer=sgd)
    devices = TableConfig("devices", 6, 4, optimizer=sgd, placement="replicated")
    return [
        FeatureConfig("user", users),
        FeatureConfig("item", items),
        FeatureConfig("history", items, hotness=5, combiner="mean"),
        FeatureConfig("device", devices),
    ]


FEATURES = make_features(0.1)


class DeepFM(Model):
    """logit = FM(user, item, history) + MLP(all embeddings, dense) + wide(dense)."""

    def __init__(self, embedding: DistributedEmbedding, **kwargs):
        super().__init__(**kwargs)
        self.embedding = embedding
        self.deep = keras.Sequential([keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)], name="deep")
        self.wide = keras.layers.Dense(1, name="wide")

    def call(self, inputs):
        pooled = self.embedding({f.name: inputs[f.name] for f in FEATURES})
        vectors = tf.stack([pooled["user"], pooled["item"], pooled["history"]], axis=1)  # [b, 3, 8]
        # FM: sum over pairs i < j of <v_i, v_j> = ((sum v)^2 - sum v^2) / 2, summed over the width.
        fm = 0.5 * tf.reduce_sum(tf.square(tf.reduce_sum(vectors, 1)) - tf.reduce_sum(tf.square(vectors), 1), 1, keepdims=True)
        deep = self.deep(tf.concat([pooled[f.name] for f in FEATURES] + [inputs["dense"]], axis=1))
        return fm + deep + self.wide(inputs["dense"])


def make_data(num_batches: int, global_batch: int, seed: int = 0) -> dict:
    """Clicks from a hidden rule: users and items have a taste, the history votes for the item."""
    rng = np.random.default_rng(seed)
    count = num_batches * global_batch
    data = {
        "user": rng.integers(0, 1000, count).astype(np.int32),
        "item": rng.integers(0, 2000, count).astype(np.int32),
        # Few distinct ids per sample, so ids repeat within a sample and across the batch.
        "history": rng.integers(0, 50, (count, 5)).astype(np.int32),
        "device": rng.integers(0, 6, count).astype(np.int32),
        "dense": rng.normal(size=(count, NUM_DENSE)).astype(np.float32),
    }
    taste = np.sin(data["user"] * 0.1) * np.cos(data["item"] * 0.07) + 0.3 * data["dense"][:, 0]
    data["label"] = (rng.random(count) < 1.0 / (1.0 + np.exp(-3.0 * taste))).astype(np.float32)[:, None]
    return data


def local_dataset(data: dict, global_batch: int, rank: int, world_size: int) -> tf.data.Dataset:
    """Rank r's rows ``[r*b, (r+1)*b)`` of every global batch, in order."""
    local = global_batch // world_size

    def mine(array):
        batches = array.reshape((-1, global_batch) + array.shape[1:])
        return batches[:, rank * local:(rank + 1) * local].reshape((-1,) + array.shape[1:])

    features = {name: mine(values) for name, values in data.items() if name != "label"}
    return tf.data.Dataset.from_tensor_slices((features, mine(data["label"]))).batch(local)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--global_batch", type=int, default=64)
    parser.add_argument("--learning_rate", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    env = initialize()
    if args.global_batch % env.world_size:
        parser.error(f"--global_batch={args.global_batch} does not divide by the number of ranks ({env.world_size})")
    keras.utils.set_random_seed(args.seed)  # the same dense initial weights on every rank
    features = make_features(args.learning_rate)
    embedding = DistributedEmbedding(features, seed=args.seed, name="embedding")
    model = DeepFM(embedding)
    model.compile(optimizer=keras.optimizers.SGD(args.learning_rate),
                  loss=keras.losses.BinaryCrossentropy(from_logits=True))
    data = make_data(args.steps, args.global_batch, args.seed)
    history = model.fit(local_dataset(data, args.global_batch, env.rank, env.world_size), epochs=1,
                        callbacks=[BroadcastInitialState()], verbose=2 if env.is_chief else 0)
    tables_in_order = list(dict.fromkeys(f.table for f in features))
    initial = {t.name: initial_table_slice(args.seed, i, t.vocabulary_size, t.embedding_dim) for i, t in enumerate(tables_in_order)}
    tables = {t.name: embedding.get_full_table(t.name) for t in tables_in_order}  # collective: every rank
    if env.is_chief:
        # The dense weights outside the embedding (its replicated tables are in `tables` already).
        embedding_ids = {id(v) for v in embedding.trainable_variables}
        dense = [v.numpy().tolist() for v in model.trainable_variables if id(v) not in embedding_ids]
        print(f"world_size {env.world_size}: final training loss {history.history['loss'][-1]:.4f}")
        if args.output:
            with open(args.output, "w") as handle:
                json.dump({"tables": {k: v.tolist() for k, v in tables.items()}, "dense": dense,
                           "loss": history.history["loss"],
                           "tables_moved": max(float(np.abs(tables[k] - initial[k]).max()) for k in tables)}, handle)


if __name__ == "__main__":
    main()
