"""Large batches (issue 11): global batch 16384 with LAMB on the MLPs vs batch 1024 with the defaults.

    .venv/bin/python benchmarks/large_batch.py [--num_train=1000000 --epochs=1]

Both train ``main.py`` on the same synthetic_small split (``--num_train`` rows, 1 epoch, seed 11)
and print ``{"benchmark": "large_batch", "config": ..., "impl": "tf_dlrm", "batch_size": ...,
"flags": [...], "auc": ..., "logloss": ..., "oracle_auc": ...}``. The large batch takes 16 times
fewer steps, so it gets a linear warmup and larger rates (``LARGE_FLAGS``, chosen as recorded in
the README); the goal is the small batch's AUC within 0.005.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from quality_data import make_dataset, oracle_auc, run_main

SMALL_FLAGS = ["--batch_size=1024"]
LARGE_FLAGS = [
    "--batch_size=16384", "--optimizer=lamb", "--dense_learning_rate=0.01", "--embedding_optimizer=lazy_adam",
    "--embedding_learning_rate=0.004", "--warmup_steps=8",
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_train", type=int, default=1_000_000)
    parser.add_argument("--num_valid", type=int, default=100_000)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--data_dir", default=os.path.join(tempfile.gettempdir(), "tf_dlrm_quality"))
    parser.add_argument("--large_flags", default=" ".join(LARGE_FLAGS), help="flags of the large-batch run")
    parser.add_argument("--only", default="small,large")
    args = parser.parse_args()
    path = make_dataset("synthetic_small", args.data_dir, args.num_train, args.num_valid)
    runs = {"small": SMALL_FLAGS, "large": args.large_flags.split()}
    for name in args.only.split(","):
        flags = runs[name] + [f"--epochs={args.epochs}", "--seed=11", "--print_freq=1000", "--valid_batch_size=16384"]
        final = run_main(path, flags, os.path.join(args.data_dir, f"large_batch_{name}_{args.num_train}.jsonl"))
        print(json.dumps({
            "benchmark": "large_batch", "config": f"synthetic_small_{args.num_train}", "impl": "tf_dlrm", "run": name,
            "flags": flags, "auc": final.get("auc"), "logloss": final.get("logloss"), "steps": final.get("steps"),
            "oracle_auc": oracle_auc(path), "error": final.get("error"),
        }), flush=True)


if __name__ == "__main__":
    main()
