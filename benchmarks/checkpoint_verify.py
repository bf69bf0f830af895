"""Time to verify a checkpoint's checksums before a restore: one thread (the naive baseline) against
``verify_files``' default thread pool, on the same files in the same run.

    .venv/bin/python benchmarks/checkpoint_verify.py [--tables=4] [--table_mib=512] [--rounds=3]

Writes a published checkpoint of ``--tables`` float32 arrays of ``--table_mib`` MiB each (random
values, so nothing compresses) under a temporary directory, verifies it ``--rounds`` times per
setting (alternating, so drift hits both alike), prints one JSON line per setting with the median
seconds and GiB/s, and one with the speedup; then deletes the files.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from emit import emit  # noqa: E402
from tf_dlrm.checkpoint import store  # noqa: E402


def write_checkpoint(root: str, tables: int, table_mib: int) -> str:
    temporary, final = store.prepare(root, 1)
    files = {}
    rows = table_mib * (1 << 20) // (64 * 4)
    for table in range(tables):
        name = f"tables/table_{table:03d}.npy"
        files[name] = store.write_npy(temporary, name, np.random.default_rng(table).random((rows, 64), dtype=np.float32))
    for name in (store.MODEL_CONFIG, store.SPEC_COPY):
        files[name] = store.write_text(temporary, name, "{}\n")
    store.write_manifest(temporary, {"format": store.FORMAT, "version": store.VERSION, "step": 1, "position": {},
                                     "model": {}, "optimizer": {}, "files": files, "tables": [], "dense": [],
                                     "optimizer_state": []})
    store.publish(root, temporary, final, keep=1)
    return final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=4)
    parser.add_argument("--table_mib", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="checkpoint_verify_")
    try:
        directory = write_checkpoint(root, args.tables, args.table_mib)
        manifest = store.read_manifest(directory)
        gib = sum(entry["bytes"] for entry in manifest["files"].values()) / (1 << 30)
        default_threads = min(store.VERIFY_THREADS, os.cpu_count() or 1, len(manifest["files"]))
        seconds = {1: [], default_threads: []}
        for _ in range(args.rounds):
            for threads in seconds:
                started = time.perf_counter()
                store.verify_files(directory, manifest, threads=threads)
                seconds[threads].append(time.perf_counter() - started)
        medians = {}
        for threads, times in seconds.items():
            medians[threads] = statistics.median(times)
            emit({"benchmark": "checkpoint_verify", "impl": "one_thread" if threads == 1 else "thread_pool",
                  "threads": threads, "gib": round(gib, 3), "median_s": round(medians[threads], 4),
                  "gib_per_s": round(gib / medians[threads], 3), "seconds": [round(t, 4) for t in times]})
        emit({"benchmark": "checkpoint_verify", "impl": "speedup", "threads": default_threads,
              "thread_pool_over_one_thread": round(medians[1] / medians[default_threads], 3)})
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
