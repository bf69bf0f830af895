"""A DIN-style model (Deep Interest Network, Zhou et al. 2018, arXiv:1706.06978) on tf_dlrm's distributed
embedding: the candidate item attends over the user's ragged history, read unpooled as a weighted sequence
feature; trained with Keras' own compile() / fit().

Tables and features (each placement and weighted pooling appear once):

- ``items`` (table-wise, Adagrad): the candidate ``item`` (one-hot) and the ``history`` (a sequence feature,
  ``combiner=None``, up to 8 ids, weighted by how recent each click is): ``[batch, 8, 8]``, zeros past a
  user's last click;
- ``tags`` (column-wise, SGD): the candidate's ``tags`` (ragged, up to 4, weighted ``mean``) and the
  ``recent_tags`` (a sequence of up to 3, unweighted);
- ``genres`` (replicated, SGD): two ``genres`` per sample with weights (weighted ``sum``);
- ``users`` (table-wise, SGD): one-hot.

Attention (DIN's activation unit): ``a_i = MLP([q, k_i, q - k_i, q * k_i])`` for each history position ``i``
with the candidate ``q``, masked past the user's history length, softmax-normalised; the interest
``sum_i a_i k_i`` joins everything else in an MLP.

Run it in one process, or on N ranks (each rank trains on its slice of every global batch; the result equals
one process with the same global batch)::

    python examples/din_model.py --steps=20
    horovodrun -np 2 -H localhost:2 --gloo python examples/din_model.py --steps=20

``--output=FILE`` writes (rank 0) every table, the dense weights and the embedding outputs of a probe batch
(pooled and sequence) as ``.npz``; ``--save=DIR`` a checkpoint; ``--restore=DIR --export=DIR`` (one process)
restores it and writes a SavedModel whose signature takes the weighted ragged inputs as values and row
lengths, served by plain TensorFlow.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tf_dlrm.checkpoint import model_checkpoint  # noqa: E402
from tf_dlrm.embedding import (  # noqa: E402
    BroadcastInitialState, DistributedEmbedding, FeatureConfig, Model, TableConfig, initialize, optimizers,
)
from tf_dlrm.embedding.serving import export_saved_model  # noqa: E402
from tf_dlrm.parallel import collectives  # noqa: E402

ROWS = {"items": 500, "tags": 60, "genres": 12, "users": 300}
HISTORY, TAGS, RECENT_TAGS, NUM_DENSE = 8, 4, 3, 2
RAGGED = ("history", "tags", "recent_tags")
WEIGHTED = ("history", "tags", "genres")
IDS = ("item", "history", "tags", "recent_tags", "genres", "user")
PROBE_ROWS = 24  # divides by 1, 2, 3 and 4 ranks


def make_features(learning_rate: float = 0.1) -> list[FeatureConfig]:
    sgd = optimizers.SGD(learning_rate=learning_rate)
    items = TableConfig("items", ROWS["items"], 8, optimizer=optimizers.Adagrad(learning_rate=0.05), placement="table_wise")
    tags = TableConfig("tags", ROWS["tags"], 8, optimizer=sgd, placement="column_wise")
    genres = TableConfig("genres", ROWS["genres"], 8, optimizer=sgd, placement="replicated")
    users = TableConfig("users", ROWS["users"], 8, optimizer=sgd, placement="table_wise")
    return [
        FeatureConfig("item", items),
        FeatureConfig("history", items, hotness=HISTORY, ragged=True, combiner=None, weighted=True),
        FeatureConfig("tags", tags, hotness=TAGS, ragged=True, combiner="mean", weighted=True),
        FeatureConfig("recent_tags", tags, hotness=RECENT_TAGS, ragged=True, combiner=None),
        FeatureConfig("genres", genres, hotness=2, combiner="sum", weighted=True),
        FeatureConfig("user", users),
    ]


def embedding_inputs(inputs: dict) -> tuple[dict, dict]:
    """``(ids, weights)`` of the embedding layer from the model's dict (weights under ``<feature>_weights``)."""
    return {name: inputs[name] for name in IDS}, {name: inputs[f"{name}_weights"] for name in WEIGHTED}


class DIN(Model):
    """logit = MLP(attention(item over history), item, tags, recent tags, genres, user, dense)."""

    def __init__(self, embedding: DistributedEmbedding, **kwargs):
        super().__init__(**kwargs)
        self.embedding = embedding
        # No bias on the score: the softmax ignores a shift of every score, so a bias would get a gradient that is
        # zero but for rounding, which Adam would turn into steps of noise.
        self.attention = keras.Sequential([keras.layers.Dense(16, activation="sigmoid"),
                                           keras.layers.Dense(1, use_bias=False)], name="attention")
        self.mlp = keras.Sequential([keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)], name="mlp")

    def call(self, inputs):
        ids, weights = embedding_inputs(inputs)
        out = self.embedding(ids, weights)
        query, keys = out["item"], out["history"]  # [b, 8], [b, H, 8]
        tiled = tf.repeat(query[:, None, :], HISTORY, axis=1)
        scores = tf.squeeze(self.attention(tf.concat([tiled, keys, tiled - keys, tiled * keys], axis=2)), 2)  # [b, H]
        # Positions past a user's history are padding: masked out of the softmax (an empty history attends to nothing).
        # With --global_ids a rank may hold the global batch of the history's ids: its own rows' lengths come apart.
        lengths = inputs["history_length"] if "history_length" in inputs else inputs["history"].row_lengths()
        present = tf.sequence_mask(lengths, HISTORY)
        scores = tf.where(present, scores, tf.fill(tf.shape(scores), -1e9))
        attention = tf.nn.softmax(scores, axis=1) * tf.cast(present, scores.dtype)
        interest = tf.reduce_sum(attention[:, :, None] * keys, axis=1)
        recent = tf.reduce_sum(out["recent_tags"], axis=1)
        everything = [interest, query, out["tags"], recent, out["genres"], out["user"], inputs["dense"]]
        return self.mlp(tf.concat(everything, axis=1))


def make_data(count: int, seed: int) -> dict:
    """Clicks from a hidden rule: a user likes items near the ones in their history; ragged features as
    ``<name>_values`` and ``<name>_lengths``, weights as ``<name>_weights`` (values for ragged ones)."""
    rng = np.random.default_rng(seed)
    data = {"item": rng.integers(0, ROWS["items"], count), "user": rng.integers(0, ROWS["users"], count),
            "genres": rng.integers(0, ROWS["genres"], (count, 2)),
            "genres_weights": rng.uniform(0.0, 2.0, (count, 2)).astype(np.float32),
            "dense": rng.normal(size=(count, NUM_DENSE)).astype(np.float32)}
    for name, hotness, rows in (("history", HISTORY, ROWS["items"]), ("tags", TAGS, ROWS["tags"]),
                                ("recent_tags", RECENT_TAGS, ROWS["tags"])):
        lengths = rng.integers(0, hotness + 1, count)
        # History ids near the candidate (a few repeats), the others uniform.
        values = (rng.integers(0, 40, lengths.sum()) if name == "history" else rng.integers(0, rows, lengths.sum()))
        data[f"{name}_values"], data[f"{name}_lengths"] = values, lengths
    data["history_weights"] = rng.uniform(0.25, 1.0, data["history_lengths"].sum()).astype(np.float32)
    data["tags_weights"] = rng.uniform(0.0, 1.0, data["tags_lengths"].sum()).astype(np.float32)
    starts = np.concatenate([[0], np.cumsum(data["history_lengths"])[:-1]])
    near = np.array([np.any(np.abs(data["history_values"][s:s + n] - (i % 40)) < 5) if n else False
                     for s, n, i in zip(starts, data["history_lengths"], data["item"])])
    score = 2.0 * near - 1.0 + 0.3 * data["dense"][:, 0]
    data["label"] = (rng.random(count) < 1.0 / (1.0 + np.exp(-2.0 * score))).astype(np.float32)[:, None]
    return data


def as_inputs(data: dict, rows=None) -> dict:
    """The model's dict input of ``data``'s rows (all, or ``rows``)."""
    pick = (lambda t: t) if rows is None else (lambda t: tf.gather(t, rows))
    inputs = {name: pick(tf.constant(data[name], tf.int64)) for name in ("item", "user", "genres")}
    inputs["genres_weights"] = pick(tf.constant(data["genres_weights"]))
    inputs["dense"] = pick(tf.constant(data["dense"]))
    for name in RAGGED:
        inputs[name] = pick(tf.RaggedTensor.from_row_lengths(tf.constant(data[f"{name}_values"], tf.int64),
                                                            data[f"{name}_lengths"]))
        if name in WEIGHTED:
            inputs[f"{name}_weights"] = pick(tf.RaggedTensor.from_row_lengths(data[f"{name}_weights"],
                                                                              data[f"{name}_lengths"]))
    return inputs


def local_rows(count: int, global_batch: int, rank: int, world_size: int) -> np.ndarray:
    """Rank r's rows ``[r*b, (r+1)*b)`` of every global batch, in order."""
    local = global_batch // world_size
    return np.concatenate([np.arange(start + rank * local, start + (rank + 1) * local)
                           for start in range(0, count, global_batch)])


SIGNATURE = {"item": tf.TensorSpec([None], tf.int64), "user": tf.TensorSpec([None], tf.int64),
             "genres": tf.TensorSpec([None, 2], tf.int64), "genres_weights": tf.TensorSpec([None, 2], tf.float32),
             "dense": tf.TensorSpec([None, NUM_DENSE], tf.float32),
             **{name: tf.RaggedTensorSpec([None, None], tf.int64, 1) for name in RAGGED},
             **{f"{name}_weights": tf.RaggedTensorSpec([None, None], tf.float32, 1) for name in ("history", "tags")}}


def probe_arrays(data: dict) -> dict:
    """A probe batch as the serving signature takes it (a ragged input as values and row lengths)."""
    inputs = as_inputs(data)
    flat = {}
    for name, value in inputs.items():
        if isinstance(value, tf.RaggedTensor):
            flat[f"{name}_values"], flat[f"{name}_row_lengths"] = value.values.numpy(), value.row_lengths().numpy()
        else:
            flat[name] = value.numpy()
    return flat


def global_names(model: DIN) -> set[str]:
    """The model inputs a rank reads for the global batch: the ids (and weights) of the features whose tables it
    owns, when the embedding reads global ids (``data_parallel_input=False``)."""
    modes = model.embedding.input_modes
    return {key for name, mode in modes.items() if mode == "global"
            for key in ((name, f"{name}_weights") if name in WEIGHTED else (name,))}


def with_global_inputs(local: tf.data.Dataset, everything: dict, names: set[str], global_batch: int) -> tf.data.Dataset:
    """``local`` (this rank's rows) with the inputs in ``names`` replaced by the global batch's, and the local rows'
    history lengths as ``history_length`` (the model's mask)."""
    global_batches = tf.data.Dataset.from_tensor_slices({name: everything[name] for name in sorted(names)}).batch(global_batch)

    def merge(pair, global_part):
        x, y = pair
        mine = {key: value for key, value in x.items() if key not in names}
        return {**mine, **global_part, "history_length": x["history"].row_lengths()}, y

    return tf.data.Dataset.zip((local, global_batches)).map(merge)


def build(seed: int, learning_rate: float, global_ids: bool = False) -> DIN:
    keras.utils.set_random_seed(seed)  # the same dense initial weights on every rank
    model = DIN(DistributedEmbedding(make_features(learning_rate), seed=seed, name="embedding",
                                     data_parallel_input=not global_ids))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    return model


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--global_batch", type=int, default=48)
    parser.add_argument("--learning_rate", type=float, default=0.1, help="the SGD tables' rate")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--output", default=None, help=".npz of tables, dense weights, probe outputs (rank 0)")
    parser.add_argument("--save", default=None, help="checkpoint directory written after training")
    parser.add_argument("--restore", default=None, help="restore this checkpoint instead of training")
    parser.add_argument("--export", default=None, help="with --restore, one process: the SavedModel to write")
    parser.add_argument("--probe", default=None, help="with --export: .npz of the probe batch as served")
    parser.add_argument("--global_ids", action="store_true",
                        help="each rank reads the global batch of the features whose tables it owns (main.py's loader), "
                             "instead of its local batch of every feature and an exchange of ids")
    args = parser.parse_args(argv)
    env = initialize()
    if args.global_batch % env.world_size:
        parser.error(f"--global_batch={args.global_batch} does not divide by the number of ranks ({env.world_size})")
    model = build(args.seed, args.learning_rate, args.global_ids)
    count = args.steps * args.global_batch
    data = make_data(count, args.seed)
    rows = local_rows(count, args.global_batch, env.rank, env.world_size)
    local = args.global_batch // env.world_size
    dataset = tf.data.Dataset.from_tensor_slices((as_inputs(data, rows), tf.gather(data["label"], rows))).batch(local)
    global_inputs = global_names(model) if args.global_ids else set()
    if global_inputs:
        dataset = with_global_inputs(dataset, as_inputs(data), global_inputs, args.global_batch)
    if args.restore:
        model(next(iter(dataset))[0])  # builds every weight
        model_checkpoint.restore(model, args.restore)
    else:
        history = model.fit(dataset, epochs=1, callbacks=[BroadcastInitialState()], verbose=0)
        if env.is_chief:
            print(f"world_size {env.world_size}: training loss {history.history['loss'][0]:.4f} .. "
                  f"{history.history['loss'][-1]:.4f}")
    if args.save:
        model_checkpoint.save(model, args.save)
    # Probe rows never trained on: this rank's share of the embedding outputs and scores, gathered in order.
    probe = make_data(PROBE_ROWS, args.seed + 100)
    share = PROBE_ROWS // env.world_size
    mine = as_inputs(probe, np.arange(env.rank * share, (env.rank + 1) * share))
    if global_inputs:  # the probe is one global batch
        everything = as_inputs(probe)
        mine.update({name: everything[name] for name in global_inputs},
                    history_length=tf.constant(probe["history_lengths"][env.rank * share:(env.rank + 1) * share]))
    outputs = model.embedding(*embedding_inputs(mine))
    arrays = {f"output/{name}": collectives.allgather(env, value, name=f"probe_{name}").numpy()
              for name, value in sorted(outputs.items())}
    arrays["probe_scores"] = collectives.allgather(
        env, tf.reshape(tf.sigmoid(model(mine, training=False)), [-1]), name="probe_scores").numpy()
    embedding = model.embedding
    for table, config in enumerate(embedding.table_configs):
        arrays[f"table/{config.name}"] = embedding.get_full_table(table)  # collective: every rank
    embedding_ids = {id(v) for v in embedding.trainable_variables}
    arrays.update({f"dense/{i}": v.numpy() for i, v in enumerate(v for v in model.trainable_variables
                                                                     if id(v) not in embedding_ids)})
    if args.export:
        export_saved_model(model, args.export, SIGNATURE)
        if args.probe:
            np.savez(args.probe, **probe_arrays(probe))
    if env.is_chief and args.output:
        np.savez(args.output, **arrays)


if __name__ == "__main__":
    main()
