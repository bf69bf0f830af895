"""Id frequencies per categorical feature, counted by one pass over a split's split_binary files.

The hot-row planner (tf_dlrm.sharding.hot_rows) needs how often each id occurs. The counts are
stored next to the dataset as ``id_counts.npz`` (one int64 array of length ``cardinality`` per
categorical feature, keyed by the feature name, plus ``__samples__``, the number of samples counted),
so that a later run reads them instead of counting again. Preprocessing may write the same file.
"""

from __future__ import annotations

if __name__ == "__main__":  # before the imports below: a stop signal while they run counts (tf_dlrm/io/early_stop.py)
    from tf_dlrm.io.early_stop import stop_while_starting

    stop_while_starting("tf_dlrm.data.id_counts")

import os

import numpy as np

from tf_dlrm.spec.feature_spec import FeatureSpec
from tf_dlrm.spec.format import SPLIT_BINARY

COUNTS_FILE = "id_counts.npz"
SAMPLES_KEY = "__samples__"
# Ids are read in blocks of this many values: bounded memory for files of any size.
_BLOCK_VALUES = 1 << 22


def counts_path(spec: FeatureSpec) -> str:
    """Where the counts of `spec`'s dataset live: next to its files."""
    return spec.resolve(COUNTS_FILE)


def count_ids(spec: FeatureSpec, split: str = "train") -> dict[str, np.ndarray]:
    """Counts every id of every categorical feature of `split` (split_binary only).

    Raises ValueError naming the file and the value position for an id outside ``[0, cardinality)``.
    """
    chunks = spec.chunks(split)
    if any(chunk["type"] != SPLIT_BINARY for chunk in chunks):
        raise ValueError(f"Split '{split}' of {spec.source} is not split_binary; cannot count its ids")
    by_feature = {f: spec.resolve(chunk["files"][0]) for chunk in chunks for f in chunk["features"]}
    counts = {}
    for name, cardinality in zip(spec.categorical_features, spec.cardinalities()):
        path = by_feature[name]
        dtype = spec.dtype(name)
        total = np.zeros(cardinality, dtype=np.int64)
        values = os.path.getsize(path) // dtype.itemsize
        for start in range(0, values, _BLOCK_VALUES):
            block = np.fromfile(path, dtype=dtype, count=min(_BLOCK_VALUES, values - start),
                                offset=start * dtype.itemsize).astype(np.int64)
            bad = np.flatnonzero((block < 0) | (block >= cardinality))
            if bad.size:
                position = start + int(bad[0])
                raise ValueError(f"{path}: value {position} of feature '{name}' is id {int(block[bad[0]])}, "
                                 f"outside [0, {cardinality})")
            total += np.bincount(block, minlength=cardinality)
        counts[name] = total
    return counts


def save_counts(path: str, counts: dict[str, np.ndarray], samples: int) -> None:
    """Writes the counts atomically (a partial file never replaces a good one)."""
    if SAMPLES_KEY in counts:
        raise ValueError(f"A feature may not be named {SAMPLES_KEY!r}")
    partial = path + ".partial.npz"
    np.savez(partial, **{SAMPLES_KEY: np.int64(samples)}, **counts)
    os.replace(partial, path)


def load_counts(path: str, spec: FeatureSpec) -> dict[str, np.ndarray]:
    """Reads counts written by `save_counts` and checks them against `spec`'s features and sizes."""
    with np.load(path) as stored:
        found = {name: stored[name] for name in stored.files if name != SAMPLES_KEY}
    for name, cardinality in zip(spec.categorical_features, spec.cardinalities()):
        if name not in found:
            raise ValueError(f"{path}: no counts for feature '{name}'")
        if found[name].shape != (cardinality,):
            raise ValueError(f"{path}: counts of feature '{name}' have shape {found[name].shape}, "
                             f"expected ({cardinality},) (the cardinality)")
        if (found[name] < 0).any():
            raise ValueError(f"{path}: negative counts for feature '{name}'")
    return {name: found[name] for name in spec.categorical_features}


def counts_for(spec: FeatureSpec, split: str = "train") -> dict[str, np.ndarray]:
    """The stored counts if present, else one counting pass whose result is stored for next time."""
    path = counts_path(spec)
    if os.path.exists(path):
        return load_counts(path, spec)
    counts = count_ids(spec, split)
    save_counts(path, counts, spec.split_files(split).num_samples)
    return counts


def main(argv=None) -> None:
    """``python -m tf_dlrm.data.id_counts --spec=DATASET/feature_spec.yaml [--hot_rows_budget=0.1]
    [--world_size=2] [--strategy=auto] [--dim=128] [--global_batch_size=B]``: counts (or reads) the ids, then
    prints the hot-row plan (with ``--global_batch_size``, only rows seen ``world_size`` times per batch)."""
    import argparse

    from tf_dlrm.sharding.hot_rows import min_count_for, plan_hot_rows
    from tf_dlrm.sharding.plan import TableSpec
    from tf_dlrm.sharding.planner import make_plan

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--split", default="train")
    parser.add_argument("--hot_rows_budget", type=float, default=0.1)
    parser.add_argument("--world_size", type=int, default=2)
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--global_batch_size", type=int, default=0,
                        help="> 0: replicate only rows looked up at least world_size times per global batch on average")
    args = parser.parse_args(argv)
    try:
        spec = FeatureSpec.load(args.spec)
        counts = counts_for(spec, args.split)
        tables = [TableSpec(name, rows, dim) for name, rows, dim in
                  zip(spec.categorical_features, spec.cardinalities(), spec.embedding_dims(args.dim))]
        plan = make_plan(tables, args.world_size, args.strategy)
        min_count = 1
        if args.global_batch_size:
            min_count = min_count_for(args.world_size, spec.split_files(args.split).num_samples, args.global_batch_size)
        hot = plan_hot_rows(plan, [counts[name] for name in spec.categorical_features], args.hot_rows_budget,
                            min_count=min_count)
    except (ValueError, OSError) as error:
        raise SystemExit(f"tf_dlrm.data.id_counts: {error}") from None
    print(f"id counts: {counts_path(spec)}")
    print(hot.describe())


if __name__ == "__main__":
    from tf_dlrm.io.stop_signals import stopping_cleanly

    with stopping_cleanly("tf_dlrm.data.id_counts"):
        main()
