"""A tiny learnable dataset in NVIDIA's split_binary layout, and helpers to damage it on purpose.

Two categorical features: ``cat_0.bin`` with 3 rows (below ``--data_parallel_threshold``, so a
replicated table with several ranks, and fused with the other table in one process) and
``cat_1.bin`` with 5000 rows (a model-parallel table).
"""

from __future__ import annotations

import os

import numpy as np

CARDINALITIES = (3, 5000)
NUM_NUMERICAL = 4
TINY_MODEL = [
    "--embedding_dim=4", "--bottom_mlp_dims=8,4", "--top_mlp_dims=8,1", "--batch_size=256", "--learning_rate=0.5",
    # SGD everywhere: a --learning_rate of 1e6 must diverge to a non-finite loss, which Adam's
    # bounded steps would not promise.
    "--optimizer=sgd", "--embedding_optimizer=sgd", "--print_freq=2", "--seed=3",
]


def write_tiny(directory, num_train: int = 2048, num_test: int = 512, seed: int = 0, splits=("train", "test")) -> str:
    """Writes the dataset into ``directory`` (created); returns it as a string."""
    from tf_dlrm.data.layout import nvidia_spec

    directory = str(directory)
    rng = np.random.default_rng(seed)
    weights = [rng.normal(0, 1.5, c) for c in CARDINALITIES]
    counts = {"train": num_train, "test": num_test, "valid": num_test}
    for split in splits:
        count = counts[split]
        os.makedirs(os.path.join(directory, split), exist_ok=True)
        numerical = rng.random((count, NUM_NUMERICAL)).astype(np.float16)
        ids = [rng.integers(0, c, count) for c in CARDINALITIES]
        logit = sum(w[i] for w, i in zip(weights, ids)) + 2 * numerical[:, 0].astype(np.float64) - 1
        label = rng.random(count) < 1 / (1 + np.exp(-logit))
        label.astype(np.bool_).tofile(os.path.join(directory, split, "label.bin"))
        numerical.tofile(os.path.join(directory, split, "numerical.bin"))
        for index, (values, cardinality) in enumerate(zip(ids, CARDINALITIES)):
            dtype = np.int8 if cardinality < 127 else np.int16
            values.astype(dtype).tofile(os.path.join(directory, split, f"cat_{index}.bin"))
    nvidia_spec(NUM_NUMERICAL, CARDINALITIES, splits=splits, base_directory=directory).save(
        os.path.join(directory, "feature_spec.yaml")
    )
    return directory


def poke_id(directory, split: str, feature: int, sample: int, value: int) -> None:
    """Overwrites one id in place."""
    path = os.path.join(str(directory), split, f"cat_{feature}.bin")
    ids = np.fromfile(path, np.int8 if CARDINALITIES[feature] < 127 else np.int16)
    ids[sample] = value
    ids.tofile(path)


def poke_numerical(directory, split: str, sample: int, column: int, value: float) -> None:
    path = os.path.join(str(directory), split, "numerical.bin")
    values = np.fromfile(path, np.float16).reshape(-1, NUM_NUMERICAL)
    values[sample, column] = value
    values.tofile(path)


def poke_label(directory, split: str, sample: int, byte: int) -> None:
    """Overwrites one label with a raw byte (the file holds one ``bool`` byte per sample)."""
    path = os.path.join(str(directory), split, "label.bin")
    labels = np.fromfile(path, np.uint8)
    labels[sample] = byte
    labels.tofile(path)
