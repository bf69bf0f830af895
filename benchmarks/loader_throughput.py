r"""Samples per second that the split_binary ``tf.data`` reader delivers on its own, from disk.

    python benchmarks/loader_throughput.py --config=criteo_capped [--num_samples=1048576] [--windows=5]

Writes a synthetic dataset of the config's shape (``--num_samples`` training samples), then reads
it the way one training process does (``SplitBinaryReader``: shuffled batch order, one ``pread``
per file and batch, the rank's categorical features split into "global" model-parallel tables and
"local" replicated ones as the sharding plan puts them) and counts what comes out of the
``tf.data`` pipeline. Each window reads ``--window_batches`` batches; with ``cache=cold`` the
files are first evicted from the page cache (``posix_fadvise(DONTNEED)``), so the bytes come from
the disk; ``cache=warm`` reads them again from memory. Windows of the two kinds alternate.

Prints one JSON object per kind and line:
``{"benchmark": "loader_throughput", "config": ..., "cache": "cold"|"warm", "world_size": 1,
"batch_size": ..., "samples_per_s": {"median": ..., "min": ..., "max": ...}, "bytes_per_sample": ...}``
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from emit import emit  # noqa: E402
from train_throughput import CONFIGS, configure_threads, load_average, make_dataset, summarize  # noqa: E402


def evict(paths) -> None:
    """Drops the files' pages from the page cache (clean pages only; no privileges needed)."""
    for path in paths:
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)


def split_paths(spec, split: str = "train") -> list[str]:
    files = spec.split_files(split)
    return [p for p in [files.label, files.numerical, *files.categorical] if p]


def make_reader(spec, config, seed: int):
    """The reader of rank 0 of one process, with the plan's global/local categorical split."""
    from tf_dlrm.data.reader import SplitBinaryReader
    from tf_dlrm.cli import builder
    from tf_dlrm.cli.model_config import ModelConfig, ShardingConfig
    from tf_dlrm.models.dlrm import DLRMConfig

    model = ModelConfig(config.embedding_dim, params=DLRMConfig(config.bottom_mlp_dims, config.top_mlp_dims))
    plan = builder.make_sharding_plan(spec, model, ShardingConfig(), 1)
    # A DLRM has one table per categorical feature, table t reading feature t.
    names = spec.categorical_features
    input_modes = {**{names[t]: "global" for t in plan.tables_on_rank(0)}, **{names[t]: "local" for t in plan.replicated}}
    return SplitBinaryReader(
        spec, "train", config.batch_size, input_modes=input_modes, last_batch="drop", shuffle=True, seed=seed,
    )


def timed_window(reader, epoch: int, batches: int) -> float:
    started = time.perf_counter()
    count = 0
    for _ in reader.dataset(epoch=epoch).take(batches):
        count += 1
    return count * reader.global_batch_size / (time.perf_counter() - started)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="criteo_capped", choices=sorted(CONFIGS))
    parser.add_argument("--num_samples", type=int, default=1 << 20)
    parser.add_argument("--window_batches", type=int, default=0, help="0: one whole epoch per window")
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--cache", default="cold,warm", help="which kinds of window: cold, warm or both")
    parser.add_argument("--intra_op_parallelism", type=int, default=0)
    parser.add_argument("--inter_op_parallelism", type=int, default=0)
    parser.add_argument("--work_dir", default=None, help="where the synthetic data goes (default: a temporary directory)")
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args(argv)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    config = CONFIGS[args.config]
    kinds = [k for k in args.cache.split(",") if k]
    if not kinds or any(k not in ("cold", "warm") for k in kinds):
        raise SystemExit(f"--cache: expected cold, warm or cold,warm. Received: {args.cache!r}")
    configure_threads(args.intra_op_parallelism, args.inter_op_parallelism)
    with tempfile.TemporaryDirectory(prefix="tf_dlrm_loader_") as temporary:
        directory = os.path.join(args.work_dir or temporary, f"{args.config}_loader")
        spec = make_dataset(config, directory, args.num_samples, args.seed)
        reader = make_reader(spec, config, args.seed)
        paths = split_paths(spec)
        batches = args.window_batches or reader.num_batches
        load_before = load_average()
        timed_window(reader, 0, min(batches, 4))  # builds the pipeline once
        results = {kind: [] for kind in kinds}
        for window in range(args.windows):
            for kind in kinds:
                if kind == "cold":
                    evict(paths)
                results[kind].append(timed_window(reader, window + 1, batches))
        reader.close()
        bytes_per_sample = sum(os.path.getsize(p) for p in paths) / spec.split_files("train").num_samples
    out = []
    for kind, values in results.items():
        record = {
            "benchmark": "loader_throughput",
            "config": args.config,
            "cache": kind,
            "world_size": 1,
            "batch_size": config.batch_size,
            "samples_per_s": summarize(values),
            "bytes_per_sample": round(bytes_per_sample, 2),
            "window_batches": batches,
            "windows": args.windows,
            "load_average_1m": [load_before, load_average()],
        }
        emit(record)
        out.append(record)
    return out


if __name__ == "__main__":
    main()
