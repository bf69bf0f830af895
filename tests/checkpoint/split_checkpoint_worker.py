"""Checkpoints across table forms: split bf16 tables <-> float32 tables (``--split_embedding_tables``).

Usage: ``[horovodrun -np N] python tests/checkpoint/split_checkpoint_worker.py DATA OUT_DIR``. Under ``--amp``:

1. trains 3 steps with split tables and saves ``OUT_DIR/split/ckpt-3`` (through ``main.py``'s code);
2. trains 3 steps with float32 tables and saves ``OUT_DIR/float32/ckpt-3``;
3. restores each checkpoint into both forms and gathers the full float32 tables (joined halves).

Rank 0 writes ``OUT_DIR/results.json``: for each (checkpoint, form) whether the restored tables equal
the checkpoint's tables (their saved slices joined) bit for bit, and the dtypes of the shard variables.
"""

from __future__ import annotations

import glob
import json
import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from checkpoint_worker import parse  # noqa: E402
from tf_dlrm.cli import modes  # noqa: E402


def flags(data: str, split: bool) -> list[str]:
    return [f"--dataset_path={data}", "--embedding_dim=8", "--bottom_mlp_dims=16,8", "--top_mlp_dims=16,1", "--batch_size=192",
            "--valid_batch_size=384", "--learning_rate=0.05", "--embedding_optimizer=lazy_adam", "--evals_per_epoch=0",
            "--print_freq=100", "--seed=7", "--amp", "--dist_strategy=column_wise", f"--split_embedding_tables={str(split).lower()}"]


def restored_tables(data: str, split: bool, checkpoint: str) -> dict:
    from tf_dlrm.cli import modes

    session = modes.open_session(parse(flags(data, split) + [f"--restore_checkpoint_path={checkpoint}"]))
    modes.restore(session)
    embedding = session.model.embedding
    tables = [embedding.get_full_table(t) for t in range(len(embedding.plan.tables))]  # collective
    record = {"shard_dtypes": sorted({str(v.dtype) for v in embedding.shard_variables})}
    if session.env.is_chief:
        from tf_dlrm.checkpoint.slices import read_table
        from tf_dlrm.checkpoint.store import read_manifest

        saved = [read_table(checkpoint, entry) for entry in read_manifest(checkpoint)["tables"]]
        record["tables"] = len(saved)
        record["equal_bits"] = len(saved) == len(tables) and all(
            a.dtype == b.dtype == np.float32 and np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(tables, saved))
    return record


def main():
    data, out_dir = sys.argv[1], sys.argv[2]
    results = {}
    for name, split in (("split", True), ("float32", False)):
        save = os.path.join(out_dir, name)
        modes.run_train(parse(flags(data, split) + ["--max_steps=3", f"--save_checkpoint_path={save}"]))
        checkpoint = sorted(glob.glob(os.path.join(save, "ckpt-*")))[-1]
        for form, into_split in (("into_split", True), ("into_float32", False)):
            results[f"{name}_{form}"] = restored_tables(data, into_split, checkpoint)
    if os.environ.get("HOROVOD_RANK", "0") == "0":
        with open(os.path.join(out_dir, "results.json"), "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
