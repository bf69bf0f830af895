r"""AUC of dynamic tables against fixed tables on synthetic data drawn from a fixed vocabulary.

    python benchmarks/dynamic_quality.py [--num_train_samples=200000] [--epochs=2] [--np=1]

Writes a synthetic dataset of ``feature_specs/synthetic_small.yaml``'s shape (ids drawn from each
table's fixed vocabulary), then trains ``main.py`` on it (same flags, seed and data) with:

- ``fixed``: the spec as written (fixed tables, one row per id);
- ``dynamic_full``: every table dynamic with capacity = its vocabulary (the ids become raw keys);
- ``dynamic_half_<policy>``: capacity ``ceil(vocabulary / 2)`` with eviction ``lru``, ``lfu``,
  ``none`` (a full table rejects new keys), and ``min_count2`` (admission after 2 sightings, LRU).

Prints one JSON line per case: ``{"benchmark": "dynamic_quality", "case": ..., "auc": ..., "logloss": ...,
"auc_minus_fixed": ..., "evictions": ..., "rejections": ...}``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import yaml

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from emit import emit  # noqa: E402

CASES = {
    "fixed": None,
    "dynamic_full": {"fraction": 1.0, "eviction": "none"},
    "dynamic_half_lru": {"fraction": 0.5, "eviction": "lru"},
    "dynamic_half_lfu": {"fraction": 0.5, "eviction": "lfu"},
    "dynamic_half_none": {"fraction": 0.5, "eviction": "none"},
    "dynamic_half_min_count2": {"fraction": 0.5, "eviction": "lru", "min_count": 2},
}
MODEL_FLAGS = ["--embedding_dim=16", "--bottom_mlp_dims=64,16", "--top_mlp_dims=64,32,1", "--batch_size=1024",
               "--print_freq=1000", "--seed=7"]


def dynamic_spec(source: str, target: str, fraction: float, eviction: str, min_count: int = 1) -> None:
    spec = yaml.safe_load(open(source, encoding="utf-8"))
    for name in spec["channel_spec"]["categorical"]:
        properties = spec["feature_spec"][name]
        properties.update(dynamic=True, capacity=max(1, math.ceil(properties["cardinality"] * fraction)), eviction=eviction)
        if min_count > 1:
            properties["min_count"] = min_count
    with open(target, "w", encoding="utf-8") as handle:
        yaml.safe_dump(spec, handle)


def train(directory: str, spec_name: str, epochs: int, ranks: int) -> list[dict]:
    log = os.path.join(directory, f"{spec_name}.jsonl")
    command = [sys.executable, "main.py", f"--dataset_path={directory}", f"--feature_spec={spec_name}", f"--epochs={epochs}",
               f"--log_path={log}", *MODEL_FLAGS]
    if ranks > 1:
        horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        command = [horovodrun, "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo", *command]
    subprocess.run(command, cwd=REPOSITORY, check=True, capture_output=True)
    return [json.loads(line) for line in open(log, encoding="utf-8")]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_train_samples", type=int, default=200_000)
    parser.add_argument("--num_valid_samples", type=int, default=50_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--np", type=int, default=1)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dynamic_quality_") as directory:
        subprocess.run([sys.executable, "-m", "tf_dlrm.data.synthetic", "--feature_spec=feature_specs/synthetic_small.yaml",
                        f"--output_dir={directory}", f"--num_train_samples={args.num_train_samples}",
                        f"--num_valid_samples={args.num_valid_samples}", "--seed=1"], cwd=REPOSITORY, check=True,
                       capture_output=True)
        fixed_auc = None
        for case in args.cases.split(","):
            settings = CASES[case]
            spec_name = "feature_spec.yaml"
            if settings is not None:
                spec_name = f"{case}.yaml"
                dynamic_spec(os.path.join(directory, "feature_spec.yaml"), os.path.join(directory, spec_name), **settings)
            events = train(directory, spec_name, args.epochs, args.np)
            final = events[-1]
            tables = next((e["tables"] for e in events if e.get("event") == "dynamic_tables"), {})
            fixed_auc = final["auc"] if case == "fixed" else fixed_auc
            emit({"benchmark": "dynamic_quality", "case": case, "world_size": args.np, "epochs": args.epochs,
                  "num_train_samples": args.num_train_samples, "auc": final["auc"], "logloss": final["logloss"],
                  "auc_minus_fixed": None if fixed_auc is None else round(final["auc"] - fixed_auc, 6),
                  "evictions": sum(t["evictions"] for t in tables.values()),
                  "rejections": sum(t["rejections"] for t in tables.values()),
                  "rows": sum(t["rows"] for t in tables.values())})


if __name__ == "__main__":
    main()
