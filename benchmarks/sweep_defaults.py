"""The sweep that chose main.py's default optimizers and rates (issue 11), as JSON lines.

    .venv/bin/python benchmarks/sweep_defaults.py [--num_train=100000 --batch_size=1024]

Trains ``main.py`` (default architecture, 1 epoch, seed 11) on synthetic_small with each candidate
setting and prints ``{"benchmark": "sweep_defaults", "config": ..., "flags": [...], "auc": ...,
"logloss": ..., "oracle_auc": ...}``. The chosen defaults are the most accurate setting that is
also stable at batch 2048 on 300k rows (the other acceptance run of the issue).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from quality_data import make_dataset, oracle_auc, run_main

CANDIDATES = {
    "old_default_sgd_0.5": ["--optimizer=sgd", "--embedding_optimizer=sgd", "--learning_rate=0.5", "--dense_learning_rate=0.5", "--embedding_learning_rate=0.5"],
    "adam1e-3_sgd1.0": ["--optimizer=adam", "--dense_learning_rate=0.001", "--embedding_optimizer=sgd", "--embedding_learning_rate=1.0"],
    "adam1e-3_adagrad0.02": ["--optimizer=adam", "--dense_learning_rate=0.001", "--embedding_optimizer=adagrad", "--embedding_learning_rate=0.02"],
    "adam1e-3_adagrad0.05": ["--optimizer=adam", "--dense_learning_rate=0.001", "--embedding_optimizer=adagrad", "--embedding_learning_rate=0.05"],
    "adam1e-3_adagrad0.1": ["--optimizer=adam", "--dense_learning_rate=0.001", "--embedding_optimizer=adagrad", "--embedding_learning_rate=0.1"],
    "adam1e-3_rowwise0.05": ["--optimizer=adam", "--dense_learning_rate=0.001", "--embedding_optimizer=rowwise_adagrad", "--embedding_learning_rate=0.05"],
    "adam1e-3_rowwise0.1": ["--optimizer=adam", "--dense_learning_rate=0.001", "--embedding_optimizer=rowwise_adagrad", "--embedding_learning_rate=0.1"],
    "adam1e-3_lazy_adam1e-3": ["--optimizer=adam", "--dense_learning_rate=0.001", "--embedding_optimizer=lazy_adam", "--embedding_learning_rate=0.001"],
    "adam1e-3_lazy_adam3e-3": ["--optimizer=adam", "--dense_learning_rate=0.001", "--embedding_optimizer=lazy_adam", "--embedding_learning_rate=0.003"],
    "lamb4e-3_rowwise0.05": ["--optimizer=lamb", "--dense_learning_rate=0.004", "--embedding_optimizer=rowwise_adagrad", "--embedding_learning_rate=0.05"],
    "adagrad0.01_adagrad0.05": ["--optimizer=adagrad", "--dense_learning_rate=0.01", "--embedding_optimizer=adagrad", "--embedding_learning_rate=0.05"],
    # Second round: the first showed the embedding rates still rising at their top values.
    "adam1e-3_adagrad0.3": ["--optimizer=adam", "--dense_learning_rate=0.001", "--embedding_optimizer=adagrad", "--embedding_learning_rate=0.3"],
    "adam1e-3_rowwise0.3": ["--optimizer=adam", "--dense_learning_rate=0.001", "--embedding_optimizer=rowwise_adagrad", "--embedding_learning_rate=0.3"],
    "adam1e-3_lazy_adam1e-2": ["--optimizer=adam", "--dense_learning_rate=0.001", "--embedding_optimizer=lazy_adam", "--embedding_learning_rate=0.01"],
    "adam3e-3_adagrad0.3": ["--optimizer=adam", "--dense_learning_rate=0.003", "--embedding_optimizer=adagrad", "--embedding_learning_rate=0.3"],
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_train", type=int, default=100_000)
    parser.add_argument("--num_valid", type=int, default=50_000)
    parser.add_argument("--batch_size", type=int, default=1024)
    parser.add_argument("--data_dir", default=os.path.join(tempfile.gettempdir(), "tf_dlrm_quality"))
    parser.add_argument("--only", default="", help="comma-separated candidate names (default: all)")
    args = parser.parse_args()
    path = make_dataset("synthetic_small", args.data_dir, args.num_train, args.num_valid)
    names = [n for n in args.only.split(",") if n] or list(CANDIDATES)
    for name in names:
        flags = CANDIDATES[name] + [f"--batch_size={args.batch_size}", "--epochs=1", "--seed=11", "--print_freq=1000"]
        log = os.path.join(args.data_dir, f"sweep_{name}_{args.num_train}_{args.batch_size}.jsonl")
        final = run_main(path, flags, log)
        print(json.dumps({
            "benchmark": "sweep_defaults", "config": f"synthetic_small_{args.num_train}_b{args.batch_size}", "candidate": name,
            "flags": CANDIDATES[name], "auc": final.get("auc"), "logloss": final.get("logloss"),
            "oracle_auc": oracle_auc(path), "error": final.get("error"),
        }), flush=True)


if __name__ == "__main__":
    main()
