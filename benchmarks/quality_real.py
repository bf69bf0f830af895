"""Quality on real public CTR data: tf_dlrm (each embedding optimizer) vs plain Keras and logistic regression.

    .venv/bin/python benchmarks/quality_real.py --raw_dir=DIR [--datasets=movielens_100k,frappe,kdd2012_track2]
        [--impls=...] [--seeds=0,1,2] [--max_epochs=6] [--work_dir=/tmp/tf_dlrm_quality_real]

Datasets (fetched by the user, never committed; ``--raw_dir`` holds ``ml-100k/``, ``frappe/``, ``kdd2012_track2/``
and ``criteo/``):

- ``movielens_100k``: MovieLens-100k (GroupLens), the copy in the public GitHub repository
  ``tule2236/Item-based-CF-with-PySpark``, folder ``ml-100k`` (files ``u.data``, ``u.user``,
  ``u.item``), commit ``9687bc4ec90fa735451556937d66428c650e1c0a``. That copy adds three rows of a
  user 0 that ``u.user`` lacks; they are dropped (100,000 ratings remain). Click = rating >= 4 (55.4%
  positive). Features: numerical ``age / 100``; categorical ``user``, ``item``, ``gender``,
  ``occupation``, ``zip3`` (first three characters of the zip code), all ``encode: vocabulary``;
  ``genres``: the movie's genres (1 to 6 of 19) as a multi-hot feature of fixed hotness 6, padded with
  the id 19 ("no genre"; the csv reader takes exactly ``hotness`` ids per cell, ragged rows are not
  read from files yet), summed.
- ``frappe``: the Frappe context-aware app-usage log (Baltrunas et al. 2015) in the libFM form of the
  public GitHub repository ``hexiangnan/neural_factorization_machine``, files
  ``data/frappe/frappe.validation.libfm`` and ``frappe.test.libfm``, commit
  ``ca2a5d11b929816aa44c6e470e795af144608507`` (``frappe.train.libfm`` of that repository is not in
  the stored snapshot); 86,582 rows, 33.1% positive. Ten categorical fields (user, item, daytime,
  weekday, isweekend, homework, cost, weather, country, city), each the libFM index of its field,
  ``encode: vocabulary``; one numerical feature ``bias`` = 1 (the dot interaction needs the bottom
  MLP's vector; a constant gives it a learnt one).
- ``kdd2012_track2``: a real search-ad click log, the 39,948-row subsample of KDD Cup 2012 Track 2
  (Tencent's Soso search ads) published as OpenML dataset 1220 ``Click_prediction_small``, here the
  copy in the public GitHub repository ``naberdam/TDS_final_project``, file
  ``data/train_raw_datasets/Click_prediction_small.csv``, commit ``e84242580b799d17fc3c869cc04d7ad31c5b41b6``
  (sha256 ``af2b6acc196de0dcbdb97d3c305fa2c29fa01cbdb3b7ff347d5f13cc13e299ab``; ``--raw_dir`` holds it as
  ``kdd2012_track2/Click_prediction_small.csv``). 16.8% positive (``click``). Ten categorical fields,
  ``encode: vocabulary``: ``url_hash``, ``ad_id``, ``advertiser_id``, ``depth``, ``position``, ``query_id``,
  ``keyword_id``, ``title_id``, ``description_id``, ``user_id``, most of them long-tailed ids (19k ads,
  31k queries, 30k users in 40k rows: most ids are seen once, as in Criteo's tail); one numerical
  feature ``log(impression)`` (impressions of the ad in the record, 1 in 85% of rows). The rows are
  kept as published (22 exact duplicates among them).
- ``criteo_1tb_sample_1k``: the only real Criteo rows that could be had here: 1,000 rows of day 0 of the
  Criteo 1TB click logs, the copy in the public GitHub repository ``vmware-archive/hillview``, file
  ``data/criteo/criteoTab.csv`` (tab-separated despite its name), kept in the project's shared data as
  ``criteo_1tb_day0_sample_1k.tsv`` (sha256 ``19925339e23c7a10bcad235f99650f75339f82b7e2b262e202c1e5b12f58f4e3``;
  ``--raw_dir`` holds it as ``criteo/criteo_1tb_day0_sample_1k.tsv``). Criteo's 100k-row ``dac_sample.txt``
  and the 100k-row Kaggle sample of ``ChenglongChen/kaggle-2014-criteo`` are over the 4 MiB that a stored
  snapshot keeps, and the other samples found (DeepCTR's ``criteo_sample.txt``, PaddleRec's
  ``sample_train.txt``) hold 100-200 rows. 21 positives (2.1%): its test split holds about 3, so its AUC is
  noise (a Hanley-McNeil s.e. near 0.1); it shows the pipeline runs on Criteo's layout, not quality.
  Features: the 13 counts as numerical ``log(1 + max(x, 0))`` (missing: 0), the 26 hashed categorical
  fields ``encode: vocabulary`` (missing: the value ``missing``).

Split: the rows of each dataset are shuffled by ``numpy.random.default_rng(0).permutation`` and cut
70% / 15% / 15% into ``train`` / ``valid`` / ``test`` csv files, transcoded with the project's own
tool (``python -m tf_dlrm.data.transcode``, vocabularies from the train split, unseen values to the
OOV id). Every model picks its number of epochs (1 .. ``--max_epochs``) on ``valid``; ``test`` is read
only at the chosen epoch. Architecture everywhere: embedding dim 16, bottom MLP 64-16, top MLP 64-1,
batch 256.

Cases (``impl``), each for seeds 0, 1, 2:

- ``tf_dlrm_defaults`` and ``tf_dlrm_defaults_<model>`` (every ``--model``: ``dlrm``, ``dcnv2``, ``deepfm``,
  ``wide_deep``, ``logistic_regression``): ``main.py`` as a user runs it, its defaults (the table optimizer
  and rates included) with the architecture (``--deep_mlp_dims=64,64`` for the families, as DeepCTR's),
  ``--epochs=--max_epochs``, ``--valid_split=valid``, ``--early_stopping_patience=--patience`` (one
  evaluation per epoch; the best validation state restored at the end) and ``--test_split=test``, which
  main.py evaluates once at that state (its ``final_test`` log record);
- ``tf_dlrm_<optimizer>``: ``main.py`` (one process) with its default flags but the architecture,
  ``--valid_split=valid``, a checkpoint per epoch, and ``--embedding_optimizer=<optimizer>``
  (``lazy_adam`` is the default); the checkpoint of the best validation AUC is then evaluated on
  ``test`` with ``--mode=eval``;
- ``keras_adam``: the same architecture in plain Keras (``keras.layers.Embedding`` per feature, dot
  interaction), Keras ``Adam`` at tf_dlrm's default rates (1e-3 on the MLPs, 3e-3 on the tables);
- ``keras_adam_3e-3``: the same with Adam 3e-3 on every weight;
- ``logistic_regression``: one weight per id of every feature plus a linear term on the numerical
  ones (Keras, Adam 0.01), L2 on the id weights chosen on ``valid`` from {0, 1e-6, 1e-5, 1e-4}.

Each line: ``{"benchmark": "quality_real", "config": DATASET, "impl": ..., "seed": ..., "epochs": chosen,
"valid_auc": ..., "auc": test AUC, "auc_se": Hanley-McNeil standard error, "logloss": ..., "ne": ...,
"calibration": ...}`` and, per (dataset, impl), a summary line with ``"seed": "mean"`` (mean AUC and the
standard error of that mean over seeds). NE (normalized entropy) = logloss / the entropy of the test split's
base rate; calibration = mean predicted probability / observed positive rate on test (1: calibrated; for
tf_dlrm, main.py's figure, with its post-hoc calibration when one is fitted). ``--label`` names a variant
(``--main_flags``) apart: it is appended to ``impl``.
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import time
import warnings

import numpy as np
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from emit import emit  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPLITS = {"train": 0.70, "valid": 0.15, "test": 0.15}
ARCHITECTURE = ["--embedding_dim=16", "--bottom_mlp_dims=64,16", "--top_mlp_dims=64,1", "--batch_size=256"]
EMBEDDING_DIM, BOTTOM, TOP, BATCH = 16, (64, 16), (64, 1), 256
LR_L2 = (0.0, 1e-6, 1e-5, 1e-4)
DEFAULT_IMPLS = "tf_dlrm_lazy_adam,tf_dlrm_catch_up_adam,tf_dlrm_dense_adam,keras_adam,keras_adam_3e-3,logistic_regression"
GENRE_HOTNESS, NO_GENRE = 6, 19
FAMILY_MODELS = ("deepfm", "dcnv2")  # with --deep_mlp_dims=64,64, as DeepCTR's below
MAX_IMPRESSION_ID = 255
KDD2012_FIELDS = ("url_hash", "ad_id", "advertiser_id", "depth", "position", "query_id", "keyword_id", "title_id",
                  "description_id", "user_id")
CRITEO_SAMPLE = "criteo_1tb_day0_sample_1k.tsv"
FRAPPE_FIELDS = ("user", "item", "daytime", "weekday", "isweekend", "homework", "cost", "weather", "country", "city")


# ---- data ----------------------------------------------------------------------------------------

def movielens_rows(raw: str) -> tuple[list[str], list[list[str]]]:
    users = {}
    with open(os.path.join(raw, "u.user"), encoding="latin-1") as handle:
        for line in handle:
            user, age, gender, occupation, zip_code = line.rstrip("\n").split("|")
            users[user] = (int(age), gender, occupation, zip_code[:3])
    genres = {}
    with open(os.path.join(raw, "u.item"), encoding="latin-1") as handle:
        for line in handle:
            cells = line.rstrip("\n").split("|")
            ids = [str(g) for g, flag in enumerate(cells[5:24]) if flag == "1"] or [str(NO_GENRE)]
            genres[cells[0]] = "|".join(ids + [str(NO_GENRE)] * (GENRE_HOTNESS - len(ids)))
    rows = []
    with open(os.path.join(raw, "u.data"), encoding="latin-1") as handle:
        for line in handle:
            user, item, rating, _ = line.split("\t")[:4]
            if user not in users:
                continue  # the copy's three rows of a user 0 that u.user does not know
            age, gender, occupation, zip3 = users[user]
            rows.append([str(int(int(rating) >= 4)), f"{age / 100:.2f}", user, item, gender, occupation, zip3, genres[item]])
    return ["label", "age", "user", "item", "gender", "occupation", "zip3", "genres"], rows


def frappe_rows(raw: str) -> tuple[list[str], list[list[str]]]:
    rows = []
    for name in ("frappe.validation.libfm", "frappe.test.libfm"):
        with open(os.path.join(raw, name)) as handle:
            for line in handle:
                cells = line.split()
                rows.append([str(int(float(cells[0]) > 0)), "1"] + [cell.split(":")[0] for cell in cells[1:]])
    return ["label", "bias", *FRAPPE_FIELDS], rows


def kdd2012_rows(raw: str) -> tuple[list[str], list[list[str]]]:
    with open(os.path.join(raw, "Click_prediction_small.csv"), newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        rows = [dict(zip(header, cells)) for cells in reader]
    return ["label", "log_impression", *KDD2012_FIELDS], [
        [row["click"], f"{math.log(int(row['impression'])):.4f}", *(row[f] for f in KDD2012_FIELDS)] for row in rows]


def criteo_rows(raw: str) -> tuple[list[str], list[list[str]]]:
    numerical = [f"I{i}" for i in range(1, 14)]
    categorical = [f"C{i}" for i in range(1, 27)]
    rows = []
    with open(os.path.join(raw, CRITEO_SAMPLE)) as handle:
        for line in handle:
            cells = line.rstrip("\n").split("\t")
            counts = [f"{math.log1p(max(int(cell), 0)):.4f}" if cell else "0" for cell in cells[1:14]]
            rows.append([cells[0], *counts, *(cell or "missing" for cell in cells[14:40])])
    return ["label", *numerical, *categorical], rows


def write_dataset(name: str, raw_dir: str, work_dir: str) -> str:
    """Writes the csv splits and their spec, transcodes them; returns the binary dataset's directory."""
    output = os.path.join(work_dir, name, "binary")
    if os.path.isfile(os.path.join(output, "feature_spec.yaml")):
        return output
    csv_dir = os.path.join(work_dir, name, "csv")
    os.makedirs(csv_dir, exist_ok=True)
    if name == "movielens_100k":
        columns, rows = movielens_rows(os.path.join(raw_dir, "ml-100k"))
        numerical, multi_hot = ["age"], {"genres": NO_GENRE + 1}
    elif name == "frappe":
        columns, rows = frappe_rows(os.path.join(raw_dir, "frappe"))
        numerical, multi_hot = ["bias"], {}
    elif name == "kdd2012_track2":
        columns, rows = kdd2012_rows(os.path.join(raw_dir, "kdd2012_track2"))
        numerical, multi_hot = ["log_impression"], {}
    elif name == "criteo_1tb_sample_1k":
        columns, rows = criteo_rows(os.path.join(raw_dir, "criteo"))
        numerical, multi_hot = columns[1:14], {}
    else:
        raise ValueError("Expected a dataset in ('movielens_100k', 'frappe', 'kdd2012_track2', 'criteo_1tb_sample_1k'). "
                         f"Received: {name!r}")
    order = np.random.default_rng(0).permutation(len(rows))
    cuts = np.cumsum([int(round(f * len(rows))) for f in SPLITS.values()])[:-1]
    categorical = [c for c in columns[1:] if c not in numerical]
    encoded = [c for c in categorical if c not in multi_hot]
    features = {"label": {"dtype": "bool"}, **{c: {"dtype": "float32"} for c in numerical}}
    for c in categorical:
        features[c] = ({"dtype": "int8", "cardinality": multi_hot[c], "hotness": GENRE_HOTNESS} if c in multi_hot
                       else {"dtype": "int32"})
    source = {}
    for split, part in zip(SPLITS, np.split(order, cuts)):
        with open(os.path.join(csv_dir, f"{split}.csv"), "w") as handle:
            handle.write(",".join(columns) + "\n")
            handle.writelines(",".join(rows[i]) + "\n" for i in part)
        source[split] = [{"type": "csv", "features": columns, "files": [f"{split}.csv"], "header": True,
                          "encode": {c: "vocabulary" for c in encoded}}]
    spec = {"feature_spec": features, "channel_spec": {"label": ["label"], "numerical": numerical, "categorical": categorical},
            "source_spec": source}
    spec_path = os.path.join(csv_dir, "spec.yaml")
    with open(spec_path, "w") as handle:
        yaml.safe_dump(spec, handle, sort_keys=False)
    subprocess.run([sys.executable, "-m", "tf_dlrm.data.transcode", f"--input_spec={spec_path}", f"--output_dir={output}"],
                   cwd=REPO, check=True)
    return output


# ---- metrics -------------------------------------------------------------------------------------

def hanley_mcneil_se(auc: float, positives: int, negatives: int) -> float:
    """Hanley & McNeil (1982), Radiology 143:29-36, eq. 2."""
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    variance = (auc * (1 - auc) + (positives - 1) * (q1 - auc * auc) + (negatives - 1) * (q2 - auc * auc)) / (positives * negatives)
    return float(np.sqrt(variance))


def base_entropy(rate: float) -> float:
    return float(-(rate * np.log(rate) + (1 - rate) * np.log(1 - rate)))


def scores_record(labels: np.ndarray, scores: np.ndarray) -> dict:
    from tf_dlrm.metrics import exact_auc, logloss

    auc, loss = float(exact_auc(labels, scores)), float(logloss(labels, scores))
    return finish_record(auc, loss, labels, float(np.mean(scores) / np.mean(labels)))


def finish_record(auc: float, loss: float, labels: np.ndarray, calibration: float | None) -> dict:
    """The test figures of one run; ``calibration``: mean predicted probability over observed positive rate."""
    positives = int(labels.sum())
    negatives = len(labels) - positives
    return {"auc": auc, "auc_se": hanley_mcneil_se(auc, positives, negatives), "logloss": loss,
            "ne": loss / base_entropy(positives / len(labels)), "calibration": calibration}


# ---- tf_dlrm via main.py ----------------------------------------------------------------------------

def tf_dlrm_case(impl: str) -> tuple[str, list[str]]:
    """``tf_dlrm_<optimizer>`` (DLRM) or ``tf_dlrm_<model>[_<optimizer>]`` -> (embedding optimizer, model flags)."""
    rest = impl[len("tf_dlrm_"):]
    for model in FAMILY_MODELS:
        if rest == model or rest.startswith(model + "_"):
            optimizer = rest[len(model) + 1:] or "lazy_adam"
            flags = [f"--model={model}", "--deep_mlp_dims=64,64"]
            if model == "deepfm" and optimizer != "lazy_adam":
                flags.append("--embedding_learning_rate=0.01")  # the rate DeepFM's lazy_adam gets by default (config/models.py)
            return optimizer, flags
    return rest, []


def run_tf_dlrm(path: str, impl: str, optimizer: str, seed: int, max_epochs: int, work: str, test_labels: np.ndarray,
                extra: list[str]) -> dict:
    run_dir = os.path.join(work, f"{impl}_{seed}")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    steps_per_epoch = split_rows(path, "train") // BATCH
    log = os.path.join(run_dir, "train.jsonl")
    command = [sys.executable, "main.py", f"--dataset_path={path}", *ARCHITECTURE, f"--epochs={max_epochs}",
               "--valid_split=valid", f"--seed={seed}", f"--log_path={log}", f"--embedding_optimizer={optimizer}",
               f"--save_checkpoint_path={run_dir}/ckpt", f"--checkpoint_every_steps={steps_per_epoch}",
               f"--keep_checkpoints={max_epochs + 1}", "--print_freq=100000", *extra]
    completed = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if completed.returncode:
        raise RuntimeError(f"main.py failed: {' '.join(command)}\n{(completed.stdout + completed.stderr)[-3000:]}")
    evals = [e for e in map(json.loads, open(log)) if e.get("event") == "eval"]
    best = max(evals, key=lambda e: e["auc"])
    found = [c for c in glob.glob(os.path.join(run_dir, "ckpt", "ckpt-*")) if int(c.rsplit("-", 1)[1]) == best["step"]]
    if not found:
        raise RuntimeError(f"no checkpoint at the best evaluation's step {best['step']} under {run_dir}/ckpt: "
                           f"{sorted(os.listdir(os.path.join(run_dir, 'ckpt')))}")
    checkpoint = found[0]
    test_log = os.path.join(run_dir, "test.jsonl")
    command = [sys.executable, "main.py", f"--dataset_path={path}", *ARCHITECTURE, "--mode=eval", "--valid_split=test",
               f"--restore_checkpoint_path={checkpoint}", f"--log_path={test_log}", f"--embedding_optimizer={optimizer}", *extra]
    completed = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if completed.returncode:
        raise RuntimeError(f"main.py eval failed: {' '.join(command)}\n{(completed.stdout + completed.stderr)[-3000:]}")
    final = [json.loads(line) for line in open(test_log)][-1]
    record = finish_record(final["auc"], final["logloss"], test_labels, final.get("calibration"))
    shutil.rmtree(os.path.join(run_dir, "ckpt"), ignore_errors=True)
    return {**record, "valid_auc": best["auc"], "epochs": round(best["step"] / steps_per_epoch, 2),
            "valid_curve": [round(e["auc"], 4) for e in evals]}


def run_tf_dlrm_defaults(path: str, impl: str, seed: int, max_epochs: int, patience: int, work: str, test_labels: np.ndarray,
                         extra: list[str]) -> dict:
    """``main.py`` as a user runs it: its defaults (table optimizer included) with the architecture,
    ``--epochs=max_epochs`` and early stopping on ``valid`` (one evaluation per epoch), ending at the
    best validation state; ``test`` is evaluated once there (``--test_split``) and never selects."""
    run_dir = os.path.join(work, f"{impl}_{seed}")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    steps_per_epoch = split_rows(path, "train") // BATCH
    log = os.path.join(run_dir, "train.jsonl")
    family = any(f.startswith("--model=") and f != "--model=dlrm" for f in extra)
    # main.py refuses another model's flags: the families have no bottom or top MLP.
    architecture = [f for f in ARCHITECTURE if not (family and f.startswith(("--bottom_mlp_dims", "--top_mlp_dims")))]
    command = [sys.executable, "main.py", f"--dataset_path={path}", *architecture, f"--epochs={max_epochs}",
               "--valid_split=valid", "--test_split=test", f"--early_stopping_patience={patience}", f"--seed={seed}",
               f"--log_path={log}", "--print_freq=100000", *extra]
    completed = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if completed.returncode:
        raise RuntimeError(f"main.py failed: {' '.join(command)}\n{(completed.stdout + completed.stderr)[-3000:]}")
    events = [json.loads(line) for line in open(log)]
    evals = [e for e in events if e.get("event") == "eval"]
    test = [e for e in events if e.get("event") == "final_test"][-1]
    record = finish_record(test["auc"], test["logloss"], test_labels, test.get("calibration"))
    return {**record, "valid_auc": max(e["auc"] for e in evals), "epochs": round(test["step"] / steps_per_epoch, 2),
            "epochs_run": len(evals), "valid_curve": [round(e["auc"], 4) for e in evals]}


# ---- plain Keras baselines ----------------------------------------------------------------------

def load_split(spec, split: str):
    """All rows of a split as numpy: (numerical [n, f], [ids [n] or [n, h] per feature], labels [n])."""
    from tf_dlrm.data.reader import SplitBinaryReader
    from tf_dlrm.spec.format import NUMERICAL_CHANNEL

    # No input modes: every categorical feature, local (one process: the whole batch).
    reader = SplitBinaryReader(spec, split, 4096, last_batch="pad", shuffle=False, seed=0)
    numerical, categorical, labels = [], [], []
    for features, y in reader.dataset(epoch=0):
        numerical.append(np.asarray(features[NUMERICAL_CHANNEL], np.float32))
        categorical.append([np.asarray(features[name]) for name in spec.categorical_features])
        labels.append(np.reshape(np.asarray(y), [-1]))
    count = reader.num_samples
    return (np.concatenate(numerical)[:count], [np.concatenate(f)[:count] for f in zip(*categorical)],
            np.concatenate(labels)[:count].astype(np.float32))


def split_rows(path: str, split: str) -> int:
    from tf_dlrm.spec.feature_spec import FeatureSpec

    spec = FeatureSpec.load(os.path.join(path, "feature_spec.yaml"))
    return len(load_split(spec, split)[2])


def pooled(table, ids):
    import tensorflow as tf

    vectors = table(ids)
    return tf.reduce_sum(vectors, axis=1) if len(ids.shape) == 2 else vectors  # multi-hot: summed, as tf_dlrm's default


def keras_dlrm(cardinalities):
    import keras
    import tensorflow as tf

    class PlainDLRM(keras.Model):
        def __init__(self):
            super().__init__()
            self.tables = [keras.layers.Embedding(rows, EMBEDDING_DIM) for rows in cardinalities]
            self.bottom = [keras.layers.Dense(w, activation="relu") for w in BOTTOM]
            self.top = [keras.layers.Dense(w, activation="relu") for w in TOP[:-1]] + [keras.layers.Dense(TOP[-1])]
            count = len(cardinalities) + 1
            self.pairs = np.tril(np.ones((count, count), bool), k=-1)

        def call(self, inputs):
            numerical, categorical = inputs
            bottom = numerical
            for layer in self.bottom:
                bottom = layer(bottom)
            stacked = tf.stack([bottom] + [pooled(t, ids) for t, ids in zip(self.tables, categorical)], axis=1)
            products = tf.boolean_mask(tf.matmul(stacked, stacked, transpose_b=True), self.pairs, axis=1)
            top = tf.concat([bottom, products], axis=1)
            for layer in self.top:
                top = layer(top)
            return top

    return PlainDLRM()


def logistic_regression(cardinalities):
    import keras
    import tensorflow as tf

    class LogisticRegression(keras.Model):
        def __init__(self):
            super().__init__()
            self.tables = [keras.layers.Embedding(rows, 1, embeddings_initializer="zeros") for rows in cardinalities]
            self.linear = keras.layers.Dense(1)

        def call(self, inputs):
            numerical, categorical = inputs
            return self.linear(numerical) + tf.add_n([pooled(t, ids) for t, ids in zip(self.tables, categorical)])

    return LogisticRegression()


def run_keras(kind: str, data: dict, cardinalities, seed: int, max_epochs: int, l2: float = 0.0) -> dict:
    """Trains ``kind`` for up to ``max_epochs``; the test record at the epoch of the best validation AUC."""
    import keras
    import tensorflow as tf

    from tf_dlrm.metrics import exact_auc

    keras.utils.set_random_seed(seed)
    warnings.filterwarnings("ignore", message=".*unbuilt state.*")  # built by the call below
    warnings.filterwarnings("ignore", message=".*does not have a `build\\(\\)` method.*")
    model = keras_dlrm(cardinalities) if kind.startswith("keras") else logistic_regression(cardinalities)
    numerical, categorical, labels = data["train"]
    model((numerical[:2], [c[:2] for c in categorical]))
    tables = [v for t in model.tables for v in t.trainable_variables]
    dense = [v for v in model.trainable_variables if all(v is not t for t in tables)]
    if kind == "keras_adam":  # tf_dlrm's default rates
        groups = [(keras.optimizers.Adam(1e-3), dense), (keras.optimizers.Adam(3e-3), tables)]
    elif kind == "keras_adam_3e-3":
        groups = [(keras.optimizers.Adam(3e-3), dense + tables)]
    else:
        groups = [(keras.optimizers.Adam(1e-2), dense + tables)]

    @tf.function
    def step(n, c, y):
        with tf.GradientTape() as tape:
            logits = tf.reshape(model((n, c)), [-1])
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits))
            if l2:
                loss += l2 * tf.add_n([tf.reduce_sum(tf.square(t)) for t in tables])
        gradients = tape.gradient(loss, [v for _, vs in groups for v in vs])
        start = 0
        for optimizer, variables in groups:
            optimizer.apply(gradients[start:start + len(variables)], variables)
            start += len(variables)

    predict = tf.function(lambda n, c: tf.sigmoid(tf.reshape(model((n, c)), [-1])))

    def scores(split):
        n, c, _ = data[split]
        return np.concatenate([predict(n[i:i + 8192], [f[i:i + 8192] for f in c]).numpy() for i in range(0, len(n), 8192)])

    rng = np.random.default_rng(seed)
    best = None
    curve = []
    for epoch in range(1, max_epochs + 1):
        order = rng.permutation(len(labels))
        for start in range(0, len(order) - BATCH + 1, BATCH):
            batch = order[start:start + BATCH]
            step(numerical[batch], [c[batch] for c in categorical], labels[batch])
        valid_auc = float(exact_auc(data["valid"][2], scores("valid")))
        curve.append(round(valid_auc, 4))
        if best is None or valid_auc > best["valid_auc"]:
            best = {**scores_record(data["test"][2], scores("test")), "valid_auc": valid_auc, "epochs": epoch}
    return {**best, "valid_curve": curve}


def run_deepctr(kind: str, data: dict, spec, seed: int, max_epochs: int) -> dict:
    """DeepCTR's ``DeepFM`` or ``DCN`` (``cross_parameterization="matrix"``, i.e. DCN-M / DCNv2, 3 cross
    layers), deep MLP 64-64, embedding dim 16, Keras Adam 1e-3 on every weight (DeepCTR's examples).

    DeepCTR 0.9.4's ``Linear`` layer calls ``add_weight(name, shape)`` positionally (Keras 2), which Keras 3
    refuses, so numerical features cannot be passed as ``DenseFeat``: frappe's constant ``bias`` is left
    out (DeepFM and DCN have their own bias), MovieLens's age is given as a categorical feature (the
    age in years as its id), and so is KDD 2012's impression count (capped at 255). Multi-hot genres: ``VarLenSparseFeat`` summed, ids shifted by one so that
    the padding is DeepCTR's masked id 0.
    """
    import keras
    import tensorflow as tf
    from deepctr.feature_column import SparseFeat, VarLenSparseFeat
    from deepctr.models import DCN, DeepFM

    from tf_dlrm.metrics import exact_auc

    keras.utils.set_random_seed(seed)
    names = list(spec.categorical_features)
    cardinalities = spec.cardinalities()

    def inputs(split):
        numerical, categorical, _ = data[split]
        features = {}
        for name, ids in zip(names, categorical):
            ids = ids.astype(np.int64)
            features[name] = np.where(ids == NO_GENRE, 0, ids + 1) if ids.ndim == 2 else ids
        if "age" in spec.numerical_features:
            features["age"] = np.rint(numerical[:, spec.numerical_features.index("age")] * 100).astype(np.int64)
        if "log_impression" in spec.numerical_features:
            impressions = np.rint(np.exp(numerical[:, spec.numerical_features.index("log_impression")]))
            features["impression"] = np.clip(impressions, 0, MAX_IMPRESSION_ID).astype(np.int64)
        return features

    columns = []
    for name, rows in zip(names, cardinalities):
        if data["train"][1][names.index(name)].ndim == 2:
            columns.append(VarLenSparseFeat(SparseFeat(name, rows + 1, embedding_dim=EMBEDDING_DIM), maxlen=GENRE_HOTNESS,
                                            combiner="sum"))
        else:
            columns.append(SparseFeat(name, rows, embedding_dim=EMBEDDING_DIM))
    if "age" in spec.numerical_features:
        columns.append(SparseFeat("age", 101, embedding_dim=EMBEDDING_DIM))
    if "log_impression" in spec.numerical_features:
        columns.append(SparseFeat("impression", MAX_IMPRESSION_ID + 1, embedding_dim=EMBEDDING_DIM))
    if kind == "deepctr_deepfm":
        model = DeepFM(columns, columns, dnn_hidden_units=(64, 64), task="binary", seed=seed)
    else:
        model = DCN(columns, columns, cross_num=3, cross_parameterization="matrix", dnn_hidden_units=(64, 64),
                    task="binary", seed=seed)
    model.compile(keras.optimizers.Adam(1e-3), "binary_crossentropy")
    train, valid, test = inputs("train"), inputs("valid"), inputs("test")
    best, curve = None, []
    for epoch in range(1, max_epochs + 1):
        model.fit(train, data["train"][2], batch_size=BATCH, epochs=1, verbose=0, shuffle=True)
        valid_auc = float(exact_auc(data["valid"][2], model.predict(valid, batch_size=8192, verbose=0).ravel()))
        curve.append(round(valid_auc, 4))
        if best is None or valid_auc > best["valid_auc"]:
            scores = np.clip(model.predict(test, batch_size=8192, verbose=0).ravel().astype(np.float64), 1e-7, 1 - 1e-7)
            best = {**scores_record(data["test"][2], scores), "valid_auc": valid_auc, "epochs": epoch}
    del tf
    return {**best, "valid_curve": curve}


# ---- driver ----------------------------------------------------------------------------------------

def summarize(paths: list[str], only: list[str] | None = None) -> str:
    """A markdown table per dataset from the per-seed JSON lines of earlier runs (later lines win);
    ``only``: these cases alone."""
    runs = {}
    for path in paths:
        for line in open(path):
            if line.startswith("{"):
                record = json.loads(line)
                if record.get("benchmark") == "quality_real" and record["seed"] != "mean" and (not only or record["impl"] in only):
                    runs[(record["config"], record["impl"], record["seed"])] = record
    out = []
    for dataset in sorted({key[0] for key in runs}):
        out += [f"\n**{dataset}** (test split; mean over seeds; AUC s.e.: Hanley-McNeil of one run, and of the mean "
                "over seeds from their spread)\n", "| impl | seeds | test AUC | s.e. (H-M) | s.e. over seeds | logloss | NE "
                "| calibration | epochs chosen | per-seed AUC | per-seed NE | per-seed calibration |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        impls = sorted({key[1] for key in runs if key[0] == dataset},
                       key=lambda i: -np.mean([r["auc"] for k, r in runs.items() if k[:2] == (dataset, i)]))
        for impl in impls:
            records = [r for k, r in sorted(runs.items(), key=lambda kv: str(kv[0][2])) if k[:2] == (dataset, impl)]
            aucs = np.array([r["auc"] for r in records])
            spread = f"{aucs.std(ddof=1) / np.sqrt(len(aucs)):.4f}" if len(aucs) > 1 else "-"
            per_seed_ne = ", ".join(f"{r['ne']:.4f}" for r in records)
            calibrations = [r.get("calibration") for r in records]
            per_seed_calibration = ", ".join("-" if c is None else f"{c:.4f}" for c in calibrations)
            calibration = "-" if None in calibrations else f"{np.mean(calibrations):.4f}"
            out.append(f"| {impl} | {len(records)} | {aucs.mean():.4f} | {np.mean([r['auc_se'] for r in records]):.4f} | "
                       f"{spread} | {np.mean([r['logloss'] for r in records]):.4f} | {np.mean([r['ne'] for r in records]):.4f} | "
                       f"{calibration} | {', '.join(str(r['epochs']) for r in records)} | "
                       f"{', '.join(f'{a:.4f}' for a in aucs)} | {per_seed_ne} | {per_seed_calibration} |")
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--raw_dir", help="directory holding ml-100k/, frappe/ and kdd2012_track2/ (see the docstring)")
    parser.add_argument("--summarize", default="", help="comma-separated JSON-lines outputs of earlier runs: print "
                        "their markdown tables and exit")
    parser.add_argument("--datasets", default="movielens_100k,frappe")
    parser.add_argument("--impls", default=None, help=f"comma-separated cases to run (default {DEFAULT_IMPLS}); with "
                        "--summarize, the cases to tabulate (default: all)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--max_epochs", type=int, default=6)
    parser.add_argument("--patience", type=int, default=2, help="--early_stopping_patience of the tf_dlrm_defaults cases")
    parser.add_argument("--work_dir", default="/tmp/tf_dlrm_quality_real")
    parser.add_argument("--main_flags", default="", help="more main.py flags for every tf_dlrm run, space separated")
    parser.add_argument("--label", default="", help="appended to each case's name in the output lines and run "
                        "directories (e.g. _rare_ids for a run with --main_flags), so variants stay apart")
    parser.add_argument("--deepctr_path", default="", help="a directory where `pip install --no-deps --target=DIR "
                        "deepctr` put DeepCTR (kept out of the project's environment)")
    args = parser.parse_args()
    if args.summarize:
        print(summarize(args.summarize.split(","), args.impls.split(",") if args.impls else None))
        return
    if not args.raw_dir:
        parser.error("--raw_dir is required (the directory holding ml-100k/, frappe/ and kdd2012_track2/)")
    if args.deepctr_path:
        sys.path.insert(0, args.deepctr_path)
    from tf_dlrm.spec.feature_spec import FeatureSpec

    seeds = [int(s) for s in args.seeds.split(",")]
    for dataset in args.datasets.split(","):
        path = write_dataset(dataset, args.raw_dir, args.work_dir)
        spec = FeatureSpec.load(os.path.join(path, "feature_spec.yaml"))
        data = {split: load_split(spec, split) for split in SPLITS}
        cardinalities = spec.cardinalities()
        for impl in (args.impls or DEFAULT_IMPLS).split(","):
            results = []
            for seed in seeds:
                started = time.time()
                if impl == "tf_dlrm_defaults" or impl.startswith("tf_dlrm_defaults_"):
                    model = impl[len("tf_dlrm_defaults_"):]
                    flags = [f"--model={model}", "--deep_mlp_dims=64,64"] if model in ("deepfm", "dcnv2", "wide_deep") else \
                        [f"--model={model}"] if model else []
                    record = run_tf_dlrm_defaults(path, impl + args.label, seed, args.max_epochs, args.patience, os.path.join(args.work_dir, dataset),
                                                  data["test"][2], flags + args.main_flags.split())
                elif impl.startswith("tf_dlrm_"):
                    optimizer, flags = tf_dlrm_case(impl)
                    record = run_tf_dlrm(path, impl + args.label, optimizer, seed, args.max_epochs, os.path.join(args.work_dir, dataset),
                                         data["test"][2], flags + args.main_flags.split())
                elif impl.startswith("deepctr_"):
                    record = run_deepctr(impl, data, spec, seed, args.max_epochs)
                elif impl == "logistic_regression":
                    candidates = [{**run_keras(impl, data, cardinalities, seed, args.max_epochs, l2), "l2": l2} for l2 in LR_L2]
                    record = max(candidates, key=lambda r: r["valid_auc"])
                else:
                    record = run_keras(impl, data, cardinalities, seed, args.max_epochs)
                results.append(record)
                emit({"benchmark": "quality_real", "config": dataset, "impl": impl + args.label, "seed": seed,
                      "train_rows": len(data["train"][2]), "test_rows": len(data["test"][2]),
                      **record, "seconds": round(time.time() - started, 1)})
            aucs = np.array([r["auc"] for r in results])
            emit({"benchmark": "quality_real", "config": dataset, "impl": impl + args.label, "seed": "mean",
                  "auc": float(aucs.mean()), "auc_se_of_mean": float(aucs.std(ddof=1) / np.sqrt(len(aucs))) if len(aucs) > 1 else None,
                  "auc_se": float(np.mean([r["auc_se"] for r in results])),
                  "logloss": float(np.mean([r["logloss"] for r in results])), "ne": float(np.mean([r["ne"] for r in results])),
                  "calibration": None if any(r["calibration"] is None for r in results)
                  else float(np.mean([r["calibration"] for r in results])),
                  "epochs": [r["epochs"] for r in results]})


if __name__ == "__main__":
    main()
