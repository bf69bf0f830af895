"""The model of tests/embedding/interest_model.py, built from the public API only, trained with
``model.fit`` (or a hand-written loop around the library's step) on N ranks or one process.

Writes (rank 0) the full tables, every table's optimizer state and the dense weights after training,
as ``.npz``, for tests/embedding/test_custom_model.py.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tf_dlrm.parallel import collectives  # noqa: E402
from tf_dlrm.parallel.env import current_env, initialize  # noqa: E402
from tf_dlrm.embedding.serving import export_saved_model  # noqa: E402
from tf_dlrm.checkpoint import model_checkpoint  # noqa: E402
from tf_dlrm.embedding import BroadcastInitialState, TrainingStep  # noqa: E402
from tests.embedding.interest_model import (  # noqa: E402
    NUM_DENSE, InterestModel, make_data, make_embedding, probe_batch, write_probe,
)

def local_dataset(data: dict, global_batch: int, rank: int, world_size: int) -> tf.data.Dataset:
    """Rank r's rows ``[r*b, (r+1)*b)`` of every global batch, in order."""
    local = global_batch // world_size
    count = len(data["item"])
    rows = np.concatenate([np.arange(start + rank * local, start + (rank + 1) * local)
                           for start in range(0, count, global_batch)])
    history = tf.RaggedTensor.from_row_lengths(data["history_values"], data["history_lengths"])
    features = {name: tf.gather(data[name], rows) for name in ("item", "user", "category", "device", "query", "numerical")}
    features["history"] = tf.gather(history, rows)
    return tf.data.Dataset.from_tensor_slices((features, tf.gather(data["label"], rows))).batch(local)


def build(seed: int, placements: str = "chosen") -> InterestModel:
    keras.utils.set_random_seed(seed)  # the same dense initial weights on every rank
    model = InterestModel(make_embedding(seed, placements))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    return model


def state_arrays(model: InterestModel) -> dict:
    """Collective: every table, every table's optimizer state and the dense weights (rank 0; None elsewhere)."""
    layer, sparse = model.embedding, model.training_step.sparse
    arrays = {}
    for table, config in enumerate(layer.table_configs):
        arrays[f"table/{config.name}"] = layer.get_full_table(table)
        optimizer = sparse.table_optimizer(table)
        for slot in optimizer.slots:
            arrays[f"state/{config.name}/{slot}"] = layer.get_full_table(
                table, lambda v, s=slot, t=table: sparse.slot(v, s, t), optimizer.row_wise)
    # The dynamic table's live rows, gathered from every rank's shards and sorted by key.
    dynamic = layer.dynamic_layer
    keys, values = dynamic.local_rows(0)
    _, accumulator = dynamic.local_rows(0, lambda v: sparse.slot(v, "accumulator"))
    keys, values, accumulator = (collectives.allgather(layer.env, tf.constant(a), name=f"dynamic_rows_{i}").numpy()
                                 for i, a in enumerate((keys, values, accumulator)))
    order = np.argsort(keys)
    arrays.update({"dynamic/queries/keys": keys[order], "table/queries": values[order],
                   "state/queries/accumulator": accumulator[order]})
    dense = [v for v in model.trainable_variables if not hasattr(v, "tf_dlrm_kind")]
    arrays.update({f"dense/{i}": v.numpy() for i, v in enumerate(dense)})
    return arrays if layer.env.is_chief else None


SIGNATURE = {"item": tf.TensorSpec([None], tf.int64), "history": tf.RaggedTensorSpec([None, None], tf.int64, 1),
             "user": tf.TensorSpec([None], tf.int64), "category": tf.TensorSpec([None], tf.int64),
             "device": tf.TensorSpec([None], tf.int64), "query": tf.TensorSpec([None], tf.int64),
             "numerical": tf.TensorSpec([None, NUM_DENSE], tf.float32)}


def train_by_hand(model: InterestModel, dataset: tf.data.Dataset) -> None:
    """The loop a user writes around the library's step: the same updates as ``fit``."""
    first, _ = next(iter(dataset))
    model(first)  # builds every weight
    loss = keras.losses.BinaryCrossentropy(from_logits=True)
    step = TrainingStep(model, current_env(), loss_fn=lambda x, y, y_pred, weight: loss(y, y_pred),
                        dense_optimizer=keras.optimizers.Adam(0.01))
    model._tf_dlrm_step = step  # what state_arrays reads the optimizer state from
    step.broadcast_initial_state()

    @tf.function
    def train(x, y):
        return step(x, y)

    for x, y in dataset:
        train(x, y)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--global_batch", type=int, default=48)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--output", required=True)
    parser.add_argument("--save", default=None, help="checkpoint directory written after training")
    parser.add_argument("--restore", default=None, help="restore this checkpoint instead of training")
    parser.add_argument("--export", default=None, help="with --restore, one process (kernels on or off): the SavedModel to write")
    parser.add_argument("--probe", default=None, help="with --export: where to write the probe rows the test serves")
    parser.add_argument("--loop", choices=("fit", "manual"), default="fit",
                        help="manual: a hand-written loop calling a TrainingStep instead of model.fit")
    parser.add_argument("--placements", choices=("chosen", "auto"), default="chosen", help="see make_features")
    args = parser.parse_args(argv)
    env = initialize()
    model = build(args.seed, args.placements)
    data = make_data(args.steps * args.global_batch, args.seed)
    dataset = local_dataset(data, args.global_batch, env.rank, env.world_size)
    if args.restore:
        model(next(iter(dataset))[0])  # builds every weight
        model_checkpoint.restore(model, args.restore)
    elif args.loop == "manual":
        train_by_hand(model, dataset)
    else:
        model.fit(dataset, epochs=1, callbacks=[BroadcastInitialState()], verbose=0)
    if args.save:
        model_checkpoint.save(model, args.save)
    arrays = state_arrays(model)
    if args.export:
        export_saved_model(model, args.export, SIGNATURE)
        # What the SavedModel serves: the probability of each probe row.
        arrays["probe_scores"] = tf.reshape(tf.sigmoid(model(probe_batch(args.seed), training=False)), [-1]).numpy()
        if args.probe and env.is_chief:
            write_probe(args.probe, args.seed)
    if env.is_chief:
        if args.placements == "auto":  # what the planner chose
            plan = model.embedding.plan
            arrays["slices_per_table"] = np.array([len(plan.table_slices(t)) for t in range(len(plan.tables))])
            arrays["bands_per_table"] = np.array([len(plan.row_bands(t)) for t in range(len(plan.tables))])
        np.savez(args.output, **arrays)


if __name__ == "__main__":
    main()
