"""Model quality on the same splits: tf_dlrm (default and best flags) vs plain Keras baselines.

    .venv/bin/python benchmarks/quality.py [--datasets=synthetic_small_300k,synthetic_small_100k,criteo_sample]

For each dataset, in one run and on the same train / validation split, prints one JSON line per
model (ARCHITECTURE "Benchmark output"; ``impl`` names the model):

- ``tf_dlrm_defaults``: ``main.py`` with default optimizer flags (only data, batch and epochs given);
- ``tf_dlrm_best``: ``main.py`` with the best optimizer flags of ``benchmarks/sweep_defaults.py`` (now the
  defaults) and ``--keep_best`` (:data:`BEST_FLAGS`);
- ``tf_dlrm_dcnv2``, ``tf_dlrm_deepfm``, ``tf_dlrm_wide_deep``: ``main.py --model=...`` with default
  flags otherwise (:data:`MODEL_FLAGS`; also ``tf_dlrm_amp`` = ``--amp`` and ``tf_dlrm_amp_split`` = ``--amp
  --split_embedding_tables``); Wide & Deep reads a copy of the spec that crosses the first
  four categorical features in two pairs (:func:`crossed_spec`);
- ``keras_adam``: the plain Keras DLRM of ``benchmarks/naive_dlrm.py`` (the same architecture:
  26-style per-feature ``keras.layers.Embedding``, dense stacks, dot interaction) with Adam on
  every weight, embeddings included;
- ``logistic_regression``: a logistic regression on the same one-hot features (one weight per id
  of every feature, i.e. a width-1 embedding per table, plus the numerical features), Adam.

Each line: ``{"benchmark": "quality", "config": DATASET, "impl": ..., "auc": ..., "logloss": ...,
"oracle_auc": ... (synthetic specs), "flags": [...]}``; AUC is exact (tf_dlrm.metrics). A tf_dlrm line also has
``ne`` and ``calibration`` and, with ``main.py``'s ``--calibration`` (on by default; fitted on the validation split,
the one these figures are of), ``uncalibrated_logloss``, ``uncalibrated_ne``, ``uncalibrated_calibration`` and the
map, ``calibrated`` (``--main_flags=--calibration=none`` for none).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np

from quality_data import make_dataset, oracle_auc, run_main

# name -> (dataset, train rows, validation rows, batch size, epochs)
CONFIGS = {
    "synthetic_small_300k": ("synthetic_small", 300_000, 50_000, 2048, 1),
    "synthetic_small_100k": ("synthetic_small", 100_000, 50_000, 1024, 1),
    "criteo_sample": ("criteo_sample", 0, 0, 64, 3),
}
# The sweep's best optimizer setting (benchmarks/sweep_defaults.py) became the defaults, so "best"
# adds what the sweep could not choose per dataset: --keep_best over 4 evaluations per epoch.
BEST_FLAGS = ["--optimizer=adam", "--dense_learning_rate=0.001", "--embedding_optimizer=lazy_adam",
              "--embedding_learning_rate=0.003", "--keep_best", "--evals_per_epoch=4"]
ARCHITECTURE = {"embedding_dim": 128, "bottom_mlp_dims": (512, 256, 128), "top_mlp_dims": (1024, 1024, 512, 256, 1)}
MODEL_FLAGS = {"tf_dlrm_dcnv2": ["--model=dcnv2"], "tf_dlrm_deepfm": ["--model=deepfm"],
               "tf_dlrm_wide_deep": ["--model=wide_deep", "--feature_spec=feature_spec_crossed.yaml"],
               "tf_dlrm_amp": ["--amp"], "tf_dlrm_amp_split": ["--amp", "--split_embedding_tables"]}
# Of a tf_dlrm run's final record: NE, calibration, and with main.py's --calibration the uncalibrated figures and the map.
CALIBRATION_FIELDS = ("ne", "calibration", "uncalibrated_logloss", "uncalibrated_ne", "uncalibrated_calibration",
                      "calibrated")
BASELINE_RATE = {"keras_adam": 0.001, "logistic_regression": 0.01}  # Adam's usual rate; LR has ~1 weight per id: 10x


def crossed_spec(path: str, spec) -> None:
    """Writes ``feature_spec_crossed.yaml`` beside the spec: categorical features 0x1 and 2x3 crossed
    into ``min(product of cardinalities, 100,000)`` buckets each (Wide & Deep's crossed features)."""
    import yaml

    names, rows = spec.categorical_features, spec.cardinalities()
    raw = spec.to_dict()
    raw["crossed_features"] = [{"features": [names[a], names[a + 1]], "buckets": min(rows[a] * rows[a + 1], 100_000)}
                               for a in (0, 2) if a + 1 < len(names)]
    with open(os.path.join(path, "feature_spec_crossed.yaml"), "w") as handle:
        yaml.safe_dump(raw, handle, sort_keys=False)


def read_split(spec, split: str, batch_size: int, training: bool, seed: int):
    from tf_dlrm.data.reader import SplitBinaryReader

    # No input modes: every categorical feature, local (one process: the whole batch).
    return SplitBinaryReader(spec, split, batch_size, last_batch="drop" if training else "pad", shuffle=training, seed=seed)


def baseline_inputs(spec, features) -> tuple:
    """A reader's dict of named features as the baselines' ``(numerical, ids of each feature in spec order)``."""
    from tf_dlrm.spec.format import NUMERICAL_CHANNEL

    return features[NUMERICAL_CHANNEL], tuple(features[name] for name in spec.categorical_features)


def fit_and_score(model, spec, batch_size: int, epochs: int, seed: int, rate: float) -> tuple[float, float]:
    """Adam on every weight of ``model`` (a Keras model of ``(numerical, categorical) -> logits``)."""
    import keras
    import tensorflow as tf

    from tf_dlrm.metrics import exact_auc, logloss

    optimizer = keras.optimizers.Adam(learning_rate=rate)

    @tf.function
    def step(numerical, categorical, label):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=model((numerical, categorical))))
        variables = model.trainable_variables
        optimizer.apply(tape.gradient(loss, variables), variables)
        return loss

    train = read_split(spec, "train", batch_size, True, seed)
    for epoch in range(epochs):
        for features, label in train.dataset(epoch=epoch):
            numerical, categorical = baseline_inputs(spec, features)
            step(tf.cast(numerical, tf.float32), categorical, label)
    # The split main.py evaluates: synthetic data's validation split, the Criteo sample's test split.
    valid = read_split(spec, "validation" if "validation" in spec.splits else "test", batch_size, False, seed)
    predict = tf.function(lambda n, c: tf.sigmoid(model((tf.cast(n, tf.float32), c))))
    scores, labels = [], []
    for features, label in valid.dataset(epoch=0):
        scores.append(np.reshape(predict(*baseline_inputs(spec, features)).numpy(), [-1]))
        labels.append(np.reshape(label.numpy(), [-1]))
    scores, labels = np.concatenate(scores)[: valid.num_samples], np.concatenate(labels)[: valid.num_samples]
    return exact_auc(labels, scores), logloss(labels, scores)


def logistic_regression(spec):
    """``sigmoid(b + w . numerical + sum_t v_t[id_t])``: one weight per one-hot feature value."""
    import keras
    import tensorflow as tf

    class LogisticRegression(keras.Model):
        def __init__(self):
            super().__init__()
            self.tables = [keras.layers.Embedding(rows, 1, embeddings_initializer="zeros") for rows in spec.cardinalities()]
            self.linear = keras.layers.Dense(1)

        def call(self, inputs):
            numerical, categorical = inputs
            one_hot = tf.add_n([tf.reshape(table(ids), [-1, 1]) for table, ids in zip(self.tables, categorical)])
            return self.linear(numerical) + one_hot

    return LogisticRegression()


def keras_dlrm(spec):
    from naive_dlrm import NaiveDLRM

    model = NaiveDLRM(spec.cardinalities(), ARCHITECTURE["embedding_dim"], ARCHITECTURE["bottom_mlp_dims"], ARCHITECTURE["top_mlp_dims"])
    model.build(((None, len(spec.numerical_features)), tuple((None,) for _ in spec.cardinalities())))
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default=",".join(CONFIGS))
    parser.add_argument("--impls", default="tf_dlrm_defaults,tf_dlrm_best,tf_dlrm_dcnv2,tf_dlrm_deepfm,tf_dlrm_wide_deep,"
                        "keras_adam,logistic_regression")
    parser.add_argument("--data_dir", default=os.path.join(tempfile.gettempdir(), "tf_dlrm_quality"))
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--main_flags", default="", help="more main.py flags for every tf_dlrm run, space separated "
                        "(e.g. --embedding_init=sqrt_rows)")
    args = parser.parse_args()
    import keras

    from tf_dlrm.spec.feature_spec import FeatureSpec

    for config in args.datasets.split(","):
        dataset, num_train, num_valid, batch_size, epochs = CONFIGS[config]
        path = make_dataset(dataset, args.data_dir, num_train, num_valid)
        spec = FeatureSpec.load(os.path.join(path, "feature_spec.yaml"))
        crossed_spec(path, spec)
        common = [f"--batch_size={batch_size}", f"--epochs={epochs}", f"--seed={args.seed}", "--print_freq=1000"]
        if "validation" not in spec.splits:  # the Criteo sample: its one held-out split chooses (--keep_best) and reports
            common.append("--select_on_test")
        for impl in args.impls.split(","):
            started = time.time()
            flags = common + (BEST_FLAGS if impl == "tf_dlrm_best" else []) + MODEL_FLAGS.get(impl, []) + args.main_flags.split()
            if impl.startswith("tf_dlrm"):
                final = run_main(path, flags, os.path.join(args.data_dir, f"quality_{config}_{impl}.jsonl"))
                auc, loss = final.get("auc"), final.get("logloss")
                # NE and calibration beside them; with --calibration (main.py's default) the model's own figures too.
                extra = {name: final.get(name) for name in CALIBRATION_FIELDS if name in final}
            else:
                keras.utils.set_random_seed(args.seed)
                model = keras_dlrm(spec) if impl == "keras_adam" else logistic_regression(spec)
                auc, loss = fit_and_score(model, spec, batch_size, epochs, args.seed, BASELINE_RATE[impl])
                flags = [f"adam {BASELINE_RATE[impl]} on every weight"] + common[:2]
                extra = {}
            print(json.dumps({
                "benchmark": "quality", "config": config, "impl": impl, "auc": auc, "logloss": loss, **extra,
                "oracle_auc": oracle_auc(path), "train_rows": spec_rows(spec, "train"), "flags": flags,
                "seconds": round(time.time() - started, 1),
            }), flush=True)


def spec_rows(spec, split: str) -> int:
    return read_split(spec, split, 1, False, 0).num_samples


if __name__ == "__main__":
    main()
