r"""Weak-machine scaling: one process with all cores vs N ranks sharing them, same global batch.

    python benchmarks/scaling.py --config=criteo_capped [--world_sizes=1,2] [--rounds=2]

Launches ``horovodrun -np N --gloo python benchmarks/scaling_worker.py`` for each world size,
alternating (``1, 2, 1, 2, ...`` for ``--rounds`` rounds) so that a change of machine load hits
both alike. Ranks on one machine share its cores: the trainer's default gives each rank
``cores / N`` intra-op threads (2 threads for ``-np 1`` and 1 each for ``-np 2`` on 2 cores).
The global batch stays the config's; each rank trains on ``batch / N`` samples of it. Throughput
of a window is ``global batch * steps / (slowest rank's seconds)``.

Prints one JSON object per world size and line:
``{"benchmark": "scaling", "config": ..., "impl": "tf_dlrm", "precision": "fp32", "xla": false,
"world_size": N, "samples_per_s": {"median": ..., "min": ..., "max": ...}, "vs_world_size_1": ...,
"max_rank_embedding_bytes": ..., "single_process_embedding_bytes": ..., "max_rank_embedding_fraction": ...}``
where the embedding bytes are those of the variables each rank really holds (its shards and the
replicated small tables). With ``--ceiling`` (the default) the record of each ``N > 1`` also has
``"no_exchange_ceiling": {"samples_per_s": ..., "vs_world_size_1": ...}``: N plain processes
started together (no Horovod), each training a whole single-process model on ``batch / N``
samples per step with ``cores / N`` threads, in the same rounds. No exchange and no allreduce
happen there, so it bounds what N ranks can reach on the machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from emit import emit  # noqa: E402

from train_throughput import CONFIGS, REPOSITORY, load_average, make_dataset, summarize  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scaling_worker.py")


def launch(world_size: int, spec_path: str, out_dir: str, config: str, worker_args: list[str], timeout: float,
           extra_env: dict | None = None) -> list[dict]:
    """One horovodrun launch; returns every rank's record."""
    os.makedirs(out_dir, exist_ok=True)
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    command = [horovodrun, "-np", str(world_size), "-H", f"localhost:{world_size}", "--gloo",
               sys.executable, WORKER, spec_path, out_dir, config, *worker_args]
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(extra_env or {}),
                       PYTHONPATH=REPOSITORY + os.pathsep + os.environ.get("PYTHONPATH", ""))
    completed = subprocess.run(command, cwd=REPOSITORY, env=environment, capture_output=True, text=True, timeout=timeout)
    if completed.returncode != 0:
        tail = (completed.stdout + completed.stderr)[-4000:]
        raise RuntimeError(f"horovodrun -np {world_size} failed with exit code {completed.returncode}:\n{tail}")
    records = []
    for rank in range(world_size):
        with open(os.path.join(out_dir, f"rank{rank}.json")) as handle:
            records.append(json.load(handle))
    return records


def launch_independent(count: int, spec_path: str, out_dir: str, config: str, worker_args: list[str], timeout: float) -> list[dict]:
    """``count`` plain single-process workers started together, no Horovod: the no-exchange ceiling."""
    os.makedirs(out_dir, exist_ok=True)
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPOSITORY + os.pathsep + os.environ.get("PYTHONPATH", ""))
    processes = [
        subprocess.Popen([sys.executable, WORKER, spec_path, out_dir, config, *worker_args, f"--independent={r}/{count}"],
                         cwd=REPOSITORY, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(count)
    ]
    failures = []
    for rank, process in enumerate(processes):
        output, _ = process.communicate(timeout=timeout)
        if process.returncode != 0:
            failures.append(f"independent process {rank} exited with {process.returncode}:\n{output[-2000:]}")
    if failures:
        raise RuntimeError("\n".join(failures))
    records = []
    for rank in range(count):
        with open(os.path.join(out_dir, f"rank{rank}.json")) as handle:
            records.append(json.load(handle))
    return records


def combined_throughputs(records: list[dict]) -> list[float]:
    """Independent processes each train their own share: per window, the sum of their rates."""
    rates = [[r["global_batch_size"] // len(records) * r["window_steps"] / s for s in r["window_seconds"]] for r in records]
    return [sum(window) for window in zip(*rates)]


def window_throughputs(records: list[dict]) -> list[float]:
    first = records[0]
    samples = first["global_batch_size"] * first["window_steps"]
    slowest = [max(times) for times in zip(*(r["window_seconds"] for r in records))]
    return [samples / seconds for seconds in slowest]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="criteo_capped", choices=sorted(CONFIGS))
    parser.add_argument("--world_sizes", default="1,2")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--windows", type=int, default=5, help="timed windows per launch")
    parser.add_argument("--window_steps", type=int, default=8)
    parser.add_argument("--warmup_steps", type=int, default=5)
    parser.add_argument("--num_batches", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=900, help="seconds per launch")
    parser.add_argument("--work_dir", default=None, help="where the synthetic data goes (default: a temporary directory)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--batch_size", type=int, default=0, help="global batch (0: the config's)")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME=SETTING[;SETTING...]: one more launch of every N > 1 per round, where a SETTING is "
                             "intra_op=K or inter_op=K (threads per rank), deduplicate_exchange=1, hot_rows_budget=F, or ENV_NAME=VALUE (an environment variable "
                             "of the ranks), e.g. --variant='inter1=inter_op=1' --variant='cycle5=HOROVOD_CYCLE_TIME=5'")
    parser.add_argument("--ceiling", action=argparse.BooleanOptionalAction, default=True,
                        help="also run, for each world size N > 1, N independent processes without any exchange")
    return parser.parse_args(argv)


def ceiling_fields(windows: list[float] | None, reference: float | None) -> dict:
    if not windows:
        return {}
    median = statistics.median(windows)
    return {"no_exchange_ceiling": {"samples_per_s": summarize(windows),
                                    "vs_world_size_1": round(median / reference, 3) if reference else None}}


def parse_variant(text: str) -> tuple[str, tuple[list[str], dict]]:
    """``NAME=SETTING;...`` -> (name, (worker thread arguments, environment))."""
    name, separator, settings = text.partition("=")
    if not separator or not name or not settings:
        raise SystemExit(f"--variant expects NAME=SETTING[;SETTING...]. Received: --variant={text}")
    thread_args, environment = [], {}
    for setting in settings.split(";"):
        key, separator, value = setting.partition("=")
        if not separator:
            raise SystemExit(f"--variant={text}: expected KEY=VALUE, got {setting!r}")
        if key in ("intra_op", "inter_op", "deduplicate_exchange"):
            thread_args.append(f"--{key}={int(value)}")
        elif key == "hot_rows_budget":
            thread_args.append(f"--{key}={float(value)}")
        else:
            environment[key] = value
    return name, (thread_args, environment)


def args_of(texts: list[str], variant: str | None) -> str:
    for text in texts:
        if variant and text.partition("=")[0] == variant:
            return text.partition("=")[2]
    return ""


def vs_ceiling(windows: list[float], ceiling: list[float] | None) -> dict:
    if not ceiling:
        return {}
    return {"vs_no_exchange_ceiling": round(statistics.median(windows) / statistics.median(ceiling), 3)}


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    config = CONFIGS[args.config]
    if args.batch_size:
        config = dataclasses.replace(config, batch_size=args.batch_size)
    variants = dict(parse_variant(text) for text in args.variant)
    world_sizes = [int(w) for w in args.world_sizes.split(",")]
    if any(config.batch_size % w for w in world_sizes):
        raise SystemExit(f"--world_sizes={args.world_sizes}: each must divide the batch size {config.batch_size}")
    worker_args = [f"--windows={args.windows}", f"--window_steps={args.window_steps}",
                   f"--warmup_steps={args.warmup_steps}", f"--num_batches={args.num_batches}", f"--seed={args.seed}",
                   f"--batch_size={config.batch_size}"]
    variant_windows = {(name, w): [] for name in variants for w in world_sizes if w > 1}
    variant_records = {}
    throughputs = {w: [] for w in world_sizes}
    ceilings = {w: [] for w in world_sizes if w > 1 and args.ceiling}
    last = {}
    with tempfile.TemporaryDirectory(prefix="tf_dlrm_scaling_") as temporary:
        directory = args.work_dir or temporary
        spec = make_dataset(config, os.path.join(directory, f"{args.config}_train"), config.batch_size * args.num_batches, args.seed)
        load_before = load_average()
        for round_index in range(args.rounds):
            for world_size in world_sizes:
                out_dir = os.path.join(temporary, f"round{round_index}_np{world_size}")
                records = launch(world_size, spec.source, out_dir, args.config, worker_args, args.timeout)
                throughputs[world_size].extend(window_throughputs(records))
                last[world_size] = records
                for name, (thread_args, extra_env) in variants.items():
                    if world_size == 1:
                        continue
                    out_dir = os.path.join(temporary, f"round{round_index}_np{world_size}_{name}")
                    records = launch(world_size, spec.source, out_dir, args.config, worker_args + thread_args, args.timeout, extra_env)
                    variant_windows[(name, world_size)].extend(window_throughputs(records))
                    variant_records[(name, world_size)] = records
                if world_size in ceilings:
                    out_dir = os.path.join(temporary, f"round{round_index}_independent{world_size}")
                    independent = launch_independent(world_size, spec.source, out_dir, args.config, worker_args, args.timeout)
                    ceilings[world_size].extend(combined_throughputs(independent))
    single = last[1][0]["embedding_bytes"] if 1 in last else None
    out = []
    cases = [(None, w) for w in world_sizes] + list(variant_windows)
    for variant, world_size in cases:
        records = last[world_size] if variant is None else variant_records[(variant, world_size)]
        windows = throughputs[world_size] if variant is None else variant_windows[(variant, world_size)]
        held = max(r["embedding_bytes"] for r in records)
        reference = statistics.median(throughputs[1]) if 1 in throughputs else None
        record = {
            "benchmark": "scaling",
            "config": args.config,
            "impl": "tf_dlrm",
            "precision": "fp32",
            "xla": False,
            "world_size": world_size,
            "variant": variant or "default",
            "variant_settings": args_of(args.variant, variant),
            "global_batch_size": config.batch_size,
            "intra_op_threads": records[0]["intra_op_threads"],
            "inter_op_threads": records[0]["inter_op_threads"],
            "samples_per_s": summarize(windows),
            "vs_world_size_1": round(statistics.median(windows) / reference, 3) if reference else None,
            **vs_ceiling(windows, ceilings.get(world_size)),
            "max_rank_embedding_bytes": held,
            "single_process_embedding_bytes": single,
            "max_rank_embedding_fraction": round(held / single, 4) if single else None,
            "launches": args.rounds,
            **ceiling_fields(ceilings.get(world_size), reference),
            "windows": args.rounds * args.windows,
            "load_average_1m": [load_before, load_average()],
        }
        emit(record)
        out.append(record)
    return out


if __name__ == "__main__":
    main()
