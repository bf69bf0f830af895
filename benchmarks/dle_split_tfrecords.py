r"""A dataset written the way NVIDIA DLRM_and_DCNv2 writes ``split_tfrecords``, trained by tf_dlrm.

    python benchmarks/dle_split_tfrecords.py [--num_train_prebatches=400] [--num_valid_prebatches=100]
        [--prebatch_size=512] [--epochs=2] [--work_dir=DIR]

The writer below follows NVIDIA's writing logic (``dataloading/split_tfrecords_multihot_dataset.py``:
``PrebatchStreamWriter``, ``serialize_composite``, ``create_writer``; driven as their
``SplitTFRecordsDataset.generate`` drives it from ``transcribe.py``), written here from those facts,
independent of tf_dlrm's own writer (:mod:`tf_dlrm.data.to_split_tfrecords`):

- one directory per input (``label``, ``numerical``, ``categorical_<i>``) with ``format.json``
  (``format, dtype, multihot, feature_name, num_features, batches_per_file``) and
  ``data_<k>.tfrecords``; ``length.json`` per split holds the pre-batch count; every pre-batch is full;
- a record is a ``tf.train.Example`` whose bytes feature ``data`` is ``serialize_tensor`` of the
  pre-batch cast to the writer's dtype (label int8, numerical float16, ids int32); a multi-hot
  feature (``hotness > 1``) is a ``tf.RaggedTensor`` serialized as a composite: the serialized
  flattened components (values, then int32 row splits) stacked and serialized again;
  a one-hot feature's ragged rows are made dense first.

The samples come from tf_dlrm's hidden model (:mod:`tf_dlrm.data.hidden_model`) with
``variable_hotness``: rows of 1 to ``hotness`` ids, power-law lengths as NVIDIA's synthetic
generator draws them, so the labels have a known best AUC (``oracle_valid_auc``).

The run: ``horovodrun -np 2 main.py --dataset_type=split_tfrecords --dist_strategy=column_wise`` and
``python main.py`` (one process) on the same dataset and flags, each saving a checkpoint, and a control:
one process again with TensorFlow's Eigen kernels (``TF_ENABLE_ONEDNN_OPTS=0``), the same arithmetic
rounded in other orders. Prints one JSON line with the oracle AUC, the runs' AUC and the largest
difference between their weights (every table, joined from its column slices, and every MLP weight):
np1 against np2, and np1 against the control (what float32 rounding alone drifts to over the run).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

# synthetic_multi_hot.yaml with a longer feature, so rows of 1 to 10 ids occur.
HOTNESS_OVERRIDES = {"cat_3.bin": 10}
TRAIN_FLAGS = ["--dataset_type=split_tfrecords", "--interaction=cat", "--bottom_mlp_dims=64,16", "--top_mlp_dims=64,32,1",
               "--embedding_dims=cat_0.bin:4", "--optimizer=sgd", "--embedding_optimizer=sgd",
               "--seed=7", "--dist_strategy=column_wise", "--print_freq=100000"]


# ---------------------------------------------------------------- NVIDIA's writing logic


def serialize_composite(tf, tensor):
    """A (ragged) tensor's flattened components, each serialized, stacked and serialized again."""
    components = tf.nest.flatten(tensor, expand_composites=True)
    return tf.io.serialize_tensor(tf.stack([tf.io.serialize_tensor(c) for c in components]))


class PrebatchWriter:
    """One input directory: ``format.json`` and ``data_<k>.tfrecords``, ``batches_per_file`` records each."""

    def __init__(self, tf, directory: str, dtype, multihot: bool = False, num_features: int = 1,
                 batches_per_file: int = 1):
        self.tf, self.directory, self.dtype, self.multihot = tf, directory, dtype, multihot
        self.batches_per_file, self.saved, self.file_index, self.writer = batches_per_file, 0, -1, None
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "format.json"), "w") as handle:
            json.dump({"format": "tfrecords", "dtype": dtype.name, "multihot": multihot, "feature_name": "data",
                       "num_features": num_features, "batches_per_file": batches_per_file}, handle)

    def save(self, prebatch) -> None:
        tf = self.tf
        if self.saved % self.batches_per_file == 0:
            if self.writer:
                self.writer.close()
            self.file_index += 1
            self.writer = tf.io.TFRecordWriter(os.path.join(self.directory, f"data_{self.file_index}.tfrecords"))
        if self.multihot:
            data = serialize_composite(tf, tf.cast(prebatch, self.dtype)).numpy()
        else:
            if isinstance(prebatch, tf.RaggedTensor):
                prebatch = prebatch.to_tensor()
            data = tf.io.serialize_tensor(tf.cast(prebatch, self.dtype)).numpy()
        example = tf.train.Example(features=tf.train.Features(
            feature={"data": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data]))}))
        self.writer.write(example.SerializeToString())
        self.saved += 1

    def close(self) -> None:
        if self.writer:
            self.writer.close()


def write_split(tf, directory: str, prebatches, hotness: list[int], num_numerical: int, num_prebatches: int) -> None:
    """Writes ``prebatches`` (``((numerical, [ragged ids per feature]), label)`` each) as one split."""
    writers = [PrebatchWriter(tf, os.path.join(directory, "numerical"), tf.float16, num_features=num_numerical,
                              batches_per_file=num_prebatches),
               PrebatchWriter(tf, os.path.join(directory, "label"), tf.int8, batches_per_file=num_prebatches)]
    categorical = [PrebatchWriter(tf, os.path.join(directory, f"categorical_{i}"), tf.int32, multihot=h > 1,
                                  batches_per_file=num_prebatches) for i, h in enumerate(hotness)]
    with open(os.path.join(directory, "length.json"), "w") as handle:
        json.dump(num_prebatches, handle)
    for (numerical, features), label in prebatches:
        writers[0].save(numerical)
        writers[1].save(label)
        for writer, feature in zip(categorical, features):
            writer.save(feature)
    for writer in writers + categorical:
        writer.close()


# ---------------------------------------------------------------- the dataset


def dataset_spec(hotness_overrides=HOTNESS_OVERRIDES) -> dict:
    """synthetic_multi_hot.yaml's features (with ``hotness_overrides``), as a DLE spec: ``alpha`` per feature."""
    with open(os.path.join(REPO, "feature_specs", "synthetic_multi_hot.yaml")) as handle:
        spec = yaml.safe_load(handle)
    for name, hotness in hotness_overrides.items():
        spec["feature_spec"][name]["hotness"] = hotness
    for name in spec["channel_spec"]["categorical"]:
        spec["feature_spec"][name]["alpha"] = 1.3  # the hidden model's id exponent, as NVIDIA's specs record it
    return spec


def write_dataset(root: str, num_train_prebatches: int, num_valid_prebatches: int, prebatch_size: int,
                  seed: int = 1, hotness_overrides=HOTNESS_OVERRIDES) -> dict:
    """Draws samples from the hidden model (rows of 1 to hotness ids) and writes them with NVIDIA's
    logic under ``root``; returns the spec written (``metadata.oracle_valid_auc``: the best AUC)."""
    import tensorflow as tf

    from tf_dlrm import metrics
    from tf_dlrm.data.hidden_model import GeneratorConfig, HiddenModel, sigmoid
    from tf_dlrm.spec.feature_spec import FeatureSpec

    raw = dataset_spec(hotness_overrides)
    spec = FeatureSpec(copy.deepcopy(raw["feature_spec"]), raw["channel_spec"], {}, {})
    model = HiddenModel(spec, seed, GeneratorConfig(variable_hotness=True))
    hotness = [spec.hotness(name) for name in spec.categorical_features]
    oracle = {}
    for split, count, stream in (("train", num_train_prebatches, 1), ("test", num_valid_prebatches, 2)):
        labels_seen, probabilities_seen = [], []

        def prebatches():
            for k in range(count):
                rng = np.random.default_rng([seed, stream, k])
                numerical, ranks, ids = model.sample(rng, prebatch_size)
                probabilities = sigmoid(model.logits(numerical, ranks))
                labels = rng.random(prebatch_size) < probabilities
                labels_seen.append(labels)
                probabilities_seen.append(probabilities)
                features = []
                for table_ids, h in zip(ids, hotness):
                    rows = table_ids.reshape(prebatch_size, -1)
                    lengths = (rows >= 0).sum(axis=1).astype(np.int32)
                    features.append(tf.RaggedTensor.from_row_lengths(rows[rows >= 0].astype(np.int32), lengths))
                yield (numerical, features), labels.astype(np.int8).reshape(-1, 1)

        write_split(tf, os.path.join(root, split), prebatches(), hotness, len(spec.numerical_features), count)
        if split == "test":
            oracle = {"oracle_valid_auc": round(float(metrics.exact_auc(np.concatenate(labels_seen),
                                                                          np.concatenate(probabilities_seen))), 6)}
    raw["metadata"] = {**oracle, "writer": "benchmarks/dle_split_tfrecords.py (NVIDIA's PrebatchStreamWriter logic)"}
    with open(os.path.join(root, "feature_spec.yaml"), "w") as handle:
        yaml.safe_dump(raw, handle, sort_keys=False)
    return raw


# ---------------------------------------------------------------- weights of a checkpoint


def checkpoint_weights(directory: str) -> dict:
    """Every table (its column slices joined) and every MLP weight of the newest checkpoint under ``directory``."""
    from tf_dlrm.checkpoint import checks, slices, store

    path = checks.latest(directory)
    manifest = store.read_manifest(path)
    weights = {f"table:{entry['name']}": slices.read_table(path, entry) for entry in manifest["tables"]}
    for entry in manifest["dense"]:
        if not entry["name"].startswith("optimizer/") and entry["name"] != "step":
            weights[entry["name"]] = np.load(os.path.join(path, entry["file"]), allow_pickle=False)
    return weights


def max_weight_difference(a: dict, b: dict) -> float:
    if set(a) != set(b):
        raise ValueError(f"the checkpoints hold different weights: {sorted(set(a) ^ set(b))}")
    return max(float(np.max(np.abs(a[name].astype(np.float64) - b[name]))) for name in a)


def final_record(path: str) -> dict:
    with open(path, encoding="utf-8") as handle:
        return json.loads(handle.read().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num_train_prebatches", type=int, default=400)
    parser.add_argument("--num_valid_prebatches", type=int, default=100)
    parser.add_argument("--prebatch_size", type=int, default=512)
    parser.add_argument("--batch_size", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--max_steps", type=int, default=None, help="stop both runs after this many steps")
    parser.add_argument("--learning_rate", type=float, default=1.0)
    parser.add_argument("--work_dir", default=None, help="kept; a dataset already written there is reused")
    args = parser.parse_args(argv)
    work = args.work_dir or tempfile.mkdtemp(prefix="dle_split_tfrecords_")
    data = os.path.join(work, "data")
    if os.path.isfile(os.path.join(data, "feature_spec.yaml")):
        with open(os.path.join(data, "feature_spec.yaml")) as handle:
            spec = yaml.safe_load(handle)
    else:
        spec = write_dataset(data, args.num_train_prebatches, args.num_valid_prebatches, args.prebatch_size)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    flags = [f"--dataset_path={data}", *TRAIN_FLAGS, f"--batch_size={args.batch_size}", f"--epochs={args.epochs}",
             f"--learning_rate={args.learning_rate}", *([f"--max_steps={args.max_steps}"] if args.max_steps else [])]
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    runs = {}
    # The control: one process again with TensorFlow's own (Eigen) kernels instead of oneDNN's, the same
    # arithmetic rounded in other orders; how far that drifts from np1 is what rounding alone gives.
    for ranks, name, extra in ((2, 2, {}), (1, 1, {}), (1, "control", {"TF_ENABLE_ONEDNN_OPTS": "0"})):
        run = f"np{ranks}{'_eigen' if extra else ''}_steps{args.max_steps or 'all'}_lr{args.learning_rate:g}"
        log, checkpoint = os.path.join(work, f"{run}.jsonl"), os.path.join(work, f"ckpt_{run}")
        command = [sys.executable, "main.py", *flags, f"--log_path={log}", f"--save_checkpoint_path={checkpoint}"]
        if ranks > 1:
            command = [horovodrun, "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo", *command]
        completed = subprocess.run(command, cwd=REPO, env={**env, **extra}, check=True, capture_output=True, text=True)
        # The plan's lines name each rank's column slices, e.g. "t3[0:8]": the tables split by columns.
        sliced = sorted({word.split("[")[0] for line in (completed.stdout + completed.stderr).splitlines()
                         for word in line.split() if word.startswith("t") and "[" in word and ":" in word})
        runs[name] = {**final_record(log), "weights": checkpoint_weights(checkpoint), "sliced": sliced}
    print(json.dumps({
        "benchmark": "dle_split_tfrecords", "train_samples": args.num_train_prebatches * args.prebatch_size,
        "valid_samples": args.num_valid_prebatches * args.prebatch_size, "epochs": args.epochs, "learning_rate": args.learning_rate,
        "hotness": {name: spec["feature_spec"][name].get("hotness", 1) for name in spec["channel_spec"]["categorical"]},
        "oracle_valid_auc": spec["metadata"]["oracle_valid_auc"],
        "column_sliced_tables_np2": runs[2]["sliced"], "auc_np2": runs[2]["auc"], "auc_np1": runs[1]["auc"], "steps": runs[2]["steps"],
        "max_weight_diff_np1_np2": max_weight_difference(runs[1]["weights"], runs[2]["weights"]),
        "auc_np1_eigen_kernels": runs["control"]["auc"],
        "max_weight_diff_np1_np1_eigen_kernels": max_weight_difference(runs[1]["weights"], runs["control"]["weights"]),
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
