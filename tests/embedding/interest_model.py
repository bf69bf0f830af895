"""A small DIN-like model that is none of tf_dlrm's models, written against ``tf_dlrm.embedding`` only.

The same class trains with ``model.fit`` in a user's script (tests/embedding/custom_model_worker.py) and
through ``main.py --model=tests.embedding.interest_model:InterestModel`` on a FeatureSpec dataset
(:func:`write_dataset`; tests/models/test_library_model_main.py). Its input is a dict of named features:
``item``, ``history`` (ragged), ``user``, ``category``, ``device``, ``query`` (raw int64 keys) and the
numerical features under ``"numerical"``, the key ``main.py``'s readers use.

Tables, one per kind the library offers:

- ``items``: read by two features (the candidate ``item`` and the user's ``history``, a ragged multi-hot
  feature of 0 to 6 ids, averaged): a shared table;
- ``users``, ``categories``: one feature each;
- ``devices``: SGD, replicated on every rank;
- ``queries``: a dynamic table of raw int64 keys (row-wise Adagrad, the base optimizer dynamic tables train
  with), sharded by key hash, with room for every key it sees (no eviction: the same rows on any number of
  ranks).

The candidate attends over nothing fancier than a dot product with the history; an MLP reads everything.
"""

from __future__ import annotations

import os

import keras
import numpy as np
import tensorflow as tf
import yaml

from tf_dlrm.embedding import DistributedEmbedding, DynamicStorage, FeatureConfig, Model, Placement, TableConfig, optimizers

ROWS = {"items": 2000, "users": 3000, "categories": 500, "devices": 7}
HISTORY = 6
NUM_DENSE = 3
FEATURES = ("item", "history", "user", "category", "device", "query")
SEED = 5


def make_features(placements: str = "chosen") -> list[FeatureConfig]:
    """``chosen``: ``items`` lazy Adam table-wise, ``users`` Adagrad column-wise, ``categories`` row-wise
    Adagrad table-wise with 10 hot rows replicated on every rank (ids drawn so that about half of the
    lookups hit them). ``auto``: the planner places every table but the replicated one, and the optimizers
    move so that the hard case is the planner's: the shared items table (a one-hot and a ragged reader)
    trains with row-wise Adagrad, users with lazy Adam, categories with Adagrad (no hot rows)."""
    row_wise = optimizers.RowWiseAdagrad(learning_rate=0.05)
    lazy_adam, adagrad = optimizers.LazyAdam(learning_rate=0.01, epsilon=1e-4), optimizers.Adagrad(learning_rate=0.05)
    if placements == "auto":
        items = TableConfig("items", ROWS["items"], 8, optimizer=row_wise)
        users = TableConfig("users", ROWS["users"], 8, optimizer=lazy_adam)
        categories = TableConfig("categories", ROWS["categories"], 8, optimizer=adagrad)
    else:
        # Table-wise: row-wise state (the categories table's) stays exact only where no column-sliced table is read
        # by a multi-hot feature.
        items = TableConfig("items", ROWS["items"], 8, optimizer=lazy_adam, placement="table_wise")
        users = TableConfig("users", ROWS["users"], 8, optimizer=adagrad, placement="column_wise")
        categories = TableConfig("categories", ROWS["categories"], 8, optimizer=row_wise,
                                 placement=Placement("table_wise", hot_rows=range(10)))
    queries = TableConfig("queries", 1, 8, optimizer=row_wise, placement=Placement(dynamic=DynamicStorage(capacity=4000)))
    devices = TableConfig("devices", ROWS["devices"], 4, optimizer=optimizers.SGD(learning_rate=0.1), placement="replicated")
    return [
        FeatureConfig("item", items),
        FeatureConfig("history", items, hotness=HISTORY, ragged=True, combiner="mean"),
        FeatureConfig("user", users),
        FeatureConfig("category", categories),
        FeatureConfig("device", devices),
        FeatureConfig("query", queries),
    ]


def make_embedding(seed: int = SEED, placements: str = "auto") -> DistributedEmbedding:
    # auto: the planner replicates the categories table (500 rows) and keeps items (2000 rows) model-parallel.
    threshold = {"data_parallel_threshold": 1000} if placements == "auto" else {}
    return DistributedEmbedding(make_features(placements), seed=seed, name="embedding", **threshold)


class InterestModel(Model):
    """logit = <item, history> + MLP(all embeddings, numerical features). Made with no argument (as
    ``main.py`` makes it), its tables are placed by the planner (``make_features("auto")``)."""

    def __init__(self, embedding: DistributedEmbedding | None = None, **kwargs):
        super().__init__(**kwargs)
        self.embedding = embedding if embedding is not None else make_embedding()
        self.mlp = keras.Sequential([keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)], name="mlp")

    def call(self, inputs):
        pooled = self.embedding({name: inputs[name] for name in FEATURES})
        interest = tf.reduce_sum(pooled["item"] * pooled["history"], axis=1, keepdims=True)
        everything = tf.concat([pooled[name] for name in FEATURES] + [inputs["numerical"]], axis=1)
        return interest + self.mlp(everything)


def make_data(count: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, HISTORY + 1, count)
    data = {
        "item": rng.integers(0, ROWS["items"], count).astype(np.int64),
        "history_values": rng.integers(0, 60, lengths.sum()).astype(np.int64),  # few ids: repeats
        "history_lengths": lengths.astype(np.int64),
        "user": rng.integers(0, ROWS["users"], count).astype(np.int64),
        # Half the lookups hit the 10 hot rows.
        "category": np.where(rng.random(count) < 0.5, rng.integers(0, 10, count),
                             rng.integers(0, ROWS["categories"], count)).astype(np.int64),
        "device": rng.integers(0, ROWS["devices"], count).astype(np.int64),
        # Raw 40-bit keys from a pool of 600.
        "query": np.random.default_rng(99).integers(0, 2**40, 600)[rng.integers(0, 600, count)].astype(np.int64),
        "numerical": rng.normal(size=(count, NUM_DENSE)).astype(np.float32),
    }
    score = np.sin(data["user"] * 0.05) * np.cos(data["item"] * 0.03) + 0.3 * data["numerical"][:, 0]
    data["label"] = (rng.random(count) < 1.0 / (1.0 + np.exp(-3.0 * score))).astype(np.float32)[:, None]
    return data


def write_dataset(directory: str, splits: dict[str, tuple[int, int]]) -> str:
    """A split_binary dataset of :func:`make_data`'s rows, ``{split: (rows, seed)}``, and its
    ``feature_spec.yaml`` (``history`` with a lengths file, ``query`` a dynamic table's raw keys); returns
    the directory."""
    from tf_dlrm.data.split_binary import SplitBinaryWriter
    from tf_dlrm.spec.feature_spec import FeatureSpec

    numerical = [f"num_{i}" for i in range(NUM_DENSE)]
    cardinality = {"item": ROWS["items"], "history": ROWS["items"], "user": ROWS["users"],
                   "category": ROWS["categories"], "device": ROWS["devices"]}
    features = {"label": {"dtype": "bool"}, **{name: {"dtype": "float16"} for name in numerical}}
    features.update({name: {"dtype": "int32", "cardinality": rows} for name, rows in cardinality.items()})
    features["history"].update(hotness=HISTORY, ragged=True, combiner="mean")
    features["query"] = {"dtype": "int64", "dynamic": True, "capacity": 4000}
    source = {}
    for split in splits:
        chunks = [{"type": "split_binary", "features": ["label"], "files": [f"{split}/label.bin"]},
                  {"type": "split_binary", "features": numerical, "files": [f"{split}/numerical.bin"]}]
        for name in FEATURES:
            chunk = {"type": "split_binary", "features": [name], "files": [f"{split}/{name}.bin"]}
            if name == "history":
                chunk["lengths"] = f"{split}/history.lengths.bin"
            chunks.append(chunk)
        source[split] = chunks
    spec = {"feature_spec": features, "source_spec": source,
            "channel_spec": {"label": ["label"], "numerical": numerical, "categorical": list(FEATURES)}}
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "feature_spec.yaml")
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(spec, handle, sort_keys=False)
    loaded = FeatureSpec.load(path, check_files=False)
    for split, (rows, seed) in splits.items():
        data = make_data(rows, seed)
        history = (data["history_values"], data["history_lengths"])
        with SplitBinaryWriter(loaded, split) as writer:
            writer.append(data["label"], data["numerical"], [data["item"], history, data["user"], data["category"],
                                                             data["device"], data["query"]])
    return directory


SERVE = """
import sys
import numpy as np
import tensorflow as tf
loaded = tf.saved_model.load(sys.argv[1])
probe = dict(np.load(sys.argv[2]))
scores = loaded.signatures["serving_default"](**{k: tf.constant(v) for k, v in probe.items()})["probability"].numpy()
assert not any(name.startswith("tf_dlrm") for name in sys.modules), "tf_dlrm was imported"
np.save(sys.argv[3], scores)
"""


def probe_batch(seed: int, count: int = 40) -> dict:
    """Rows never trained on (another seed), for comparing served scores with the model's."""
    data = make_data(count, seed + 100)
    history = tf.RaggedTensor.from_row_lengths(data["history_values"], data["history_lengths"])
    return {**{name: tf.constant(data[name]) for name in ("item", "user", "category", "device", "query", "numerical")},
            "history": history}


def write_probe(path: str, seed: int) -> None:
    """:func:`probe_batch` as the serving signature takes it (a ragged input as values and row lengths)."""
    probe = probe_batch(seed)
    flat = {name: value.numpy() for name, value in probe.items() if name != "history"}
    flat.update(history_values=probe["history"].values.numpy(), history_row_lengths=probe["history"].row_lengths().numpy())
    np.savez(path, **flat)


def serve_without_tf_dlrm(exported: str, probe: str, output: str) -> np.ndarray:
    """The scores of ``probe`` (:func:`write_probe`'s file) served from ``exported`` by a process that never
    imports tf_dlrm, run outside the repository with no PYTHONPATH to it."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-c", SERVE, exported, probe, output], check=True, cwd=os.path.dirname(output),
                   env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=300)
    return np.load(output)
