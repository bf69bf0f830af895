"""Runs several ``main.py``-style tasks in one process (one horovodrun launch), for the checkpoint tests.

Usage: ``[horovodrun -np N] python tests/checkpoint/checkpoint_worker.py TASKS.json OUT_DIR``. Each task is
``{"name", "action", "argv", "expect_error"?}`` with ``argv`` the flags of ``main.py``:

- ``train`` / ``mode``: what ``main.py`` does with those flags (training, or eval/inference/export);
- ``predict``: restore the checkpoint of the flags, evaluate the validation split, and predict the
  first validation batch; rank 0 writes ``OUT_DIR/<name>_predictions.npy`` and, with one rank,
  that batch as ``OUT_DIR/<name>_batch.npz`` (the exported SavedModel's inputs, :func:`serving_batch`);
  with ``"whole_split": true`` (one rank) the whole validation split too (:func:`write_split`).

Rank 0 writes ``OUT_DIR/results.json``: ``{name: record}``; with ``expect_error`` the record is
``{"error": message}`` of the CheckpointError / ValueError the task raised (on every rank).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tf_dlrm.cli import main as cli  # noqa: E402  (defines main.py's flags)
from tf_dlrm.cli.flags import config_from_flags  # noqa: E402


def parse(argv):
    cli.FLAGS.unparse_flags()
    cli.FLAGS(["main.py", *argv])
    return config_from_flags(cli.FLAGS)


def predict(config, name, out_dir, whole_split=False):
    from tf_dlrm.cli import builder, modes, preflight
    from tf_dlrm.cli.evaluation_splits import resolve
    from tf_dlrm.train.loop import evaluate

    session = modes.open_session(config)
    header = modes.restore(session)
    # The split --mode=eval reads (NVIDIA's TFRecords: its record directories).
    split = resolve(config.valid_split, config.test_split, preflight.available_splits(config, session.spec)).valid
    reader = builder.make_reader(session.spec, split, config.valid_batch_size, session.env, session.model.input_modes,
                                 False, config.seed, config.dataset_type)
    result = evaluate(session.trainer, reader)
    every_rank = every_rank_metrics(session.trainer, reader)
    features, label = first_batch(session.spec, reader)
    probabilities, _ = session.trainer.predict_step(features, label)
    if session.env.is_chief:
        np.save(os.path.join(out_dir, f"{name}_predictions.npy"), probabilities.numpy())
        if session.env.world_size == 1:
            np.savez(os.path.join(out_dir, f"{name}_batch.npz"), **serving_batch(session.spec, features))
    if whole_split and session.env.world_size == 1:
        write_split(session.spec, reader, os.path.join(out_dir, f"{name}_split"))
    return {"auc": result.auc, "logloss": result.logloss, "samples": result.samples, "step": header["step"],
            "checkpoint": header["path"], "metrics": result.metrics.as_dict(), "every_rank_metrics": every_rank}


def first_batch(spec, reader) -> tuple:
    """``(features, label)`` of the reader's first batch: its ``read_batch(0)`` (ids listed global columns
    first, then local ones) as a features dict where the reader has it, else the dataset's first element."""
    from tf_dlrm.spec.format import NUMERICAL_CHANNEL

    if not hasattr(reader, "read_batch"):
        return next(iter(reader.dataset()))
    import tensorflow as tf

    numerical, categorical, label = reader.read_batch(0)
    columns = list(reader.global_categorical) + list(reader.local_categorical)
    # A ragged feature's ids come as (values, row lengths), as the dataset makes its RaggedTensor of them.
    categorical = [tf.RaggedTensor.from_row_lengths(*ids) if isinstance(ids, tuple) else ids for ids in categorical]
    return {NUMERICAL_CHANNEL: numerical, **{spec.categorical_features[c]: ids for c, ids in zip(columns, categorical)}}, label


def every_rank_metrics(trainer, reader) -> dict:
    """The metrics as evaluation computed them before it gathered to rank 0: every rank allgathers
    every global batch's scores and labels (``predict_step``) and computes them all."""
    from tf_dlrm.metrics import ClickMetrics

    scores, labels = [], []
    for features, label in reader.dataset(epoch=0):
        probability, truth = trainer.predict_step(features, label)
        scores.append(probability.numpy())
        labels.append(truth.numpy())
    scores, labels = np.concatenate(scores)[: reader.num_samples], np.concatenate(labels)[: reader.num_samples]
    return ClickMetrics.of(labels, scores).as_dict()


def write_split(spec, reader, stem: str) -> None:
    """Every validation sample the evaluation reads, as one serving batch (``STEM.npz``, :func:`serving_batch`)
    and its labels (``STEM_labels.npy``): what a served model must score to give evaluation's metrics."""
    parts, labels = [], []
    for features, label in reader.dataset(epoch=0):
        parts.append(serving_batch(spec, features))
        labels.append(np.asarray(label).reshape(-1))
    inputs = {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
    np.savez(f"{stem}.npz", **inputs)
    np.save(f"{stem}_labels.npy", np.concatenate(labels)[: reader.num_samples])


def serving_batch(spec, features) -> dict:
    """A batch (one process, every feature read) as the exported SavedModel's inputs: ``numerical``, and each
    categorical feature's ids under its input name: ``[batch]`` one-hot, ``[batch, hotness]`` fixed multi-hot,
    a ragged one as values and row lengths."""
    import tensorflow as tf

    from tf_dlrm.embedding.serving import input_name
    from tf_dlrm.spec.format import NUMERICAL_CHANNEL

    batch = {"numerical": np.asarray(features[NUMERICAL_CHANNEL], np.float32)}
    for feature in spec.categorical_features:
        ids, name = features[feature], input_name(feature)
        if isinstance(ids, tf.RaggedTensor):
            batch[f"{name}_values"] = ids.values.numpy().astype(np.int64)
            batch[f"{name}_row_lengths"] = ids.row_lengths().numpy().astype(np.int64)
        elif spec.hotness(feature) == 1 and not spec.ragged(feature):
            batch[name] = np.asarray(ids).reshape(-1).astype(np.int64)
        else:
            batch[name] = np.asarray(ids).astype(np.int64)
    return batch


def run_task(task, out_dir):
    from tf_dlrm.cli import modes

    config = parse(task["argv"])
    try:
        if task["action"] == "train":
            return modes.run_train(config)
        if task["action"] == "mode":
            return modes.run(config)
        return predict(config, task["name"], out_dir, task.get("whole_split", False))
    except ValueError as error:
        if not task.get("expect_error"):
            raise
        return {"error": str(error)}


def main():
    tasks_path, out_dir = sys.argv[1], sys.argv[2]
    with open(tasks_path) as handle:
        tasks = json.load(handle)
    results = {}
    for task in tasks:
        results[task["name"]] = run_task(task, out_dir)
    if os.environ.get("HOROVOD_RANK", "0") == "0":
        with open(os.path.join(out_dir, "results.json"), "w") as handle:
            json.dump(results, handle, indent=1, default=str)


if __name__ == "__main__":
    main()
