"""``main.py`` with its dataset, checkpoints, logs and export on TensorFlow's in-memory ``ram://`` filesystem.

Usage: ``python tests/io/remote_storage_run.py LOCAL_DATASET OUT.json``. ``ram://`` lives in one process,
so this one process copies the split_binary dataset into ``ram://data``, then runs what ``main.py`` runs
for three command lines (parsed by main.py's own flags): train 4 steps saving every 2 steps, train
on to step 8 with ``--resume`` (and ``--keep_checkpoints=2``: retention deletes on ram://), and
``--mode=export`` of the latest checkpoint; it loads the SavedModel back from ``ram://`` and scores the
validation split with it. A straight local run of 8 steps on the local copy of the dataset is the reference.
OUT.json (a local file) holds what the test asserts.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tf_dlrm.cli import main as cli  # noqa: E402  (defines main.py's flags)
from tf_dlrm.cli.flags import config_from_flags  # noqa: E402

REMOTE = "ram://storage_test"


def run(argv: list[str]) -> dict:
    from tf_dlrm.cli import modes

    cli.FLAGS.unparse_flags()
    cli.FLAGS(["main.py", *argv])
    return modes.run(config_from_flags(cli.FLAGS))


def copy_tree(source: str, target: str) -> None:
    import tensorflow as tf

    for root, _, names in os.walk(source):
        relative = os.path.relpath(root, source)
        folder = target if relative == "." else f"{target}/{relative}"
        tf.io.gfile.makedirs(folder)
        for name in names:
            tf.io.gfile.copy(os.path.join(root, name), f"{folder}/{name}")


def read_events(path: str) -> list[dict]:
    import tensorflow as tf

    with tf.io.gfile.GFile(path, "r") as handle:
        return [json.loads(line) for line in handle.read().splitlines() if line]


def main(local_data: str, out_path: str) -> None:
    import tensorflow as tf

    from tf_dlrm.data.reader import SplitBinaryReader
    from tf_dlrm.embedding.serving import input_name
    from tf_dlrm.metrics import ClickMetrics
    from tf_dlrm.spec.feature_spec import FeatureSpec

    copy_tree(local_data, f"{REMOTE}/data")
    model = ["--embedding_dim=8", "--bottom_mlp_dims=16,8", "--top_mlp_dims=16,1", "--batch_size=192",
             "--valid_batch_size=500", "--learning_rate=0.05", "--optimizer=adam", "--embedding_optimizer=adagrad",
             "--print_freq=4", "--evals_per_epoch=0", "--seed=7"]
    remote = model + [f"--dataset_path={REMOTE}/data", f"--save_checkpoint_path={REMOTE}/ckpt", "--checkpoint_every_steps=2",
                      "--keep_checkpoints=2"]
    first = run(remote + ["--max_steps=4", f"--log_path={REMOTE}/logs/first.jsonl", f"--tensorboard_dir={REMOTE}/tb"])
    after_first = sorted(tf.io.gfile.listdir(f"{REMOTE}/ckpt"))
    resumed = run(remote + ["--max_steps=8", "--resume", f"--log_path={REMOTE}/logs/resumed.jsonl"])
    evaluated = run(remote + ["--mode=eval", "--resume", f"--log_path={REMOTE}/logs/eval.dllogger", "--log_format=dllogger"])
    exported = run(remote + ["--mode=export", "--resume", f"--saved_model_path={REMOTE}/export"])
    straight = run(model + [f"--dataset_path={local_data}", "--max_steps=8"])

    served = tf.saved_model.load(f"{REMOTE}/export").signatures["serving_default"]
    spec = FeatureSpec.load(f"{REMOTE}/data/feature_spec.yaml")
    # input_modes=None: every categorical feature read, in spec order (one process: the whole batch).
    reader = SplitBinaryReader(spec, "validation", 500, last_batch="keep")
    scores, labels = [], []
    for batch in range(reader.num_batches):
        numerical, categorical, label = reader.read_batch(batch)
        ids = {input_name(feature): tf.constant(np.reshape(column, [-1]), tf.int64)
               for feature, column in zip(spec.categorical_features, categorical)}
        out = served(numerical=tf.constant(numerical), **ids)
        scores.append(out["probability"].numpy())
        labels.append(label.reshape(-1))
    served_auc = ClickMetrics.of(np.concatenate(labels), np.concatenate(scores)).auc
    reader.close()

    first_events = read_events(f"{REMOTE}/logs/first.jsonl")
    resumed_events = read_events(f"{REMOTE}/logs/resumed.jsonl")
    with tf.io.gfile.GFile(f"{REMOTE}/logs/eval.dllogger", "r") as handle:
        dllogger = [json.loads(line[len("DLLL "):]) for line in handle.read().splitlines()]
    result = {
        "first": first, "resumed": resumed, "eval": evaluated, "export": exported, "straight": straight,
        "served_auc": served_auc,
        "checkpoints_after_first": after_first,
        "checkpoints_after_resume": sorted(tf.io.gfile.listdir(f"{REMOTE}/ckpt")),
        "saved_steps_first": [e["step"] for e in first_events if e["event"] == "checkpoint_saved"],
        "resumed_restored": [e for e in resumed_events if e["event"] == "checkpoint_restored"],
        "resumed_saved_steps": [e["step"] for e in resumed_events if e["event"] == "checkpoint_saved"],
        "eval_dllogger_auc": [r["data"]["auc"] for r in dllogger if r["step"] == [] and "auc" in r["data"]],
        "tensorboard_files": tf.io.gfile.listdir(f"{REMOTE}/tb"),
        "export_files": sorted(tf.io.gfile.listdir(f"{REMOTE}/export")),
    }
    with open(out_path, "w") as handle:
        json.dump(result, handle, indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
