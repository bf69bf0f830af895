r"""Where a training step's time goes, per rank: input, lookup, exchange, dense forward/backward,
allreduce, update, waiting, next to the bytes each rank moves.

    python benchmarks/step_breakdown.py --config=criteo_capped --batch_size=16384 [--world_size=2] [--steps=3]
        [--env=HOROVOD_CYCLE_TIME=1 ...] [--intra_op=0 --inter_op=0] [--independent]

Launches ``horovodrun -np N --gloo python benchmarks/step_breakdown_worker.py`` (the phases are
described there) and, with ``--independent``, N plain processes without Horovod running the same
phases on ``batch / N`` samples each (their exchange and allreduce are no-ops): a phase that is
slower under Horovod than there is slowed by Horovod's presence (its threads), not by bytes.

Prints one JSON object per rank and mode:
``{"benchmark": "step_breakdown", "mode": "horovod"|"independent", "rank": r, "world_size": N,
"global_batch_size": ..., "ms": {phase: median ms}, "waiting_ms": {phase: median ms},
"phase_sum_ms": ..., "step_ms": ..., "bytes_per_step": {...}}`` where ``dense_backward`` is
``dense_forward_backward - dense_forward`` and ``phase_sum_ms`` adds input, lookup, exchange,
dense forward+backward, allreduce and update (``step_ms`` is the real fused step, which overlaps
some of them and reads no input).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from emit import emit  # noqa: E402

from train_throughput import CONFIGS, REPOSITORY, make_dataset  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "step_breakdown_worker.py")
SUMMED = ("input", "lookup", "exchange", "dense_forward_backward", "allreduce", "update")


def parse_env(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        name, separator, value = pair.partition("=")
        if not separator or not name:
            raise SystemExit(f"--env expects NAME=VALUE. Received: --env={pair}")
        out[name] = value
    return out


def run_workers(args, spec_path: str, out_dir: str, independent: bool, extra_env: dict) -> list[dict]:
    os.makedirs(out_dir, exist_ok=True)
    worker_args = [spec_path, out_dir, args.config, f"--batch_size={args.batch_size}", f"--steps={args.steps}",
                   f"--intra_op={args.intra_op}", f"--inter_op={args.inter_op}"]
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **extra_env,
                       PYTHONPATH=REPOSITORY + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if independent:
        processes = [subprocess.Popen([sys.executable, WORKER, *worker_args, f"--independent={r}/{args.world_size}"],
                                      cwd=REPOSITORY, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                     for r in range(args.world_size)]
        for rank, process in enumerate(processes):
            output, _ = process.communicate(timeout=args.timeout)
            if process.returncode != 0:
                raise RuntimeError(f"independent process {rank} exited with {process.returncode}:\n{output[-3000:]}")
    else:
        horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        command = [horovodrun, "-np", str(args.world_size), "-H", f"localhost:{args.world_size}", "--gloo",
                   sys.executable, WORKER, *worker_args]
        completed = subprocess.run(command, cwd=REPOSITORY, env=environment, capture_output=True, text=True, timeout=args.timeout)
        if completed.returncode != 0:
            raise RuntimeError(f"horovodrun failed ({completed.returncode}):\n{(completed.stdout + completed.stderr)[-4000:]}")
    records = []
    for rank in range(args.world_size):
        with open(os.path.join(out_dir, f"rank{rank}.json")) as handle:
            records.append(json.load(handle))
    return records


def summarize(record: dict, mode: str, args, extra_env: dict) -> dict:
    from tf_dlrm.sharding.traffic import step_traffic

    ms = {name: round(statistics.median(values) * 1e3, 2) for name, values in record["seconds"].items()}
    ms["dense_backward"] = round(ms["dense_forward_backward"] - ms["dense_forward"], 2)
    waiting = {name: round(statistics.median(values) * 1e3, 2) for name, values in record["waiting"].items()}
    horovod = mode == "horovod"
    widths = record["send_widths"] if horovod else [0] * args.world_size
    traffic = step_traffic(widths, record["global_batch_size"], 4, record["allreduce_payload_bytes"] if horovod else 0)
    return {
        "benchmark": "step_breakdown", "config": args.config, "impl": "tf_dlrm", "precision": "fp32", "xla": False,
        "mode": mode, "rank": record["rank"], "world_size": args.world_size,
        "global_batch_size": record["global_batch_size"], "intra_op_threads": record["intra_op_threads"],
        "inter_op_threads": record["inter_op_threads"], "env": extra_env if horovod else {},
        "horovod_cycle_time": record.get("horovod_cycle_time"), "ms": ms, "waiting_ms": waiting,
        "phase_sum_ms": round(sum(ms[name] for name in SUMMED), 2), "step_ms": ms["step"],
        "bytes_per_step": traffic[record["rank"]].to_dict(),
    }


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="criteo_capped", choices=sorted(CONFIGS))
    parser.add_argument("--batch_size", type=int, default=0, help="global batch (0: the config's)")
    parser.add_argument("--world_size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--intra_op", type=int, default=0)
    parser.add_argument("--inter_op", type=int, default=0)
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the Horovod ranks (repeatable)")
    parser.add_argument("--independent", action=argparse.BooleanOptionalAction, default=True,
                        help="also run the phases in N plain processes without Horovod")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--work_dir", default=None)
    args = parser.parse_args(argv)
    config = CONFIGS[args.config]
    args.batch_size = args.batch_size or config.batch_size
    if args.batch_size % args.world_size:
        raise SystemExit(f"--batch_size={args.batch_size} does not divide by --world_size={args.world_size}")
    extra_env = parse_env(args.env)
    out = []
    with tempfile.TemporaryDirectory(prefix="tf_dlrm_breakdown_") as temporary:
        directory = args.work_dir or temporary
        import dataclasses

        spec = make_dataset(dataclasses.replace(config, batch_size=args.batch_size),
                            os.path.join(directory, f"{args.config}_{args.batch_size}"), args.batch_size * 2, 1)
        modes = [("horovod", False)] + ([("independent", True)] if args.independent else [])
        for mode, independent in modes:
            for record in run_workers(args, spec.source, os.path.join(temporary, mode), independent, extra_env):
                line = summarize(record, mode, args, extra_env)
                emit(line)
                out.append(line)
    return out


if __name__ == "__main__":
    main()
