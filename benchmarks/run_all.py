r"""Runs every benchmark, collects their JSON lines into one file and checks the targets.

    python benchmarks/run_all.py --output=benchmarks/results.json [--quick] [--with_preprocess]

Runs, each in its own process (one after the other: they share the machine's cores):

1. ``train_throughput.py --config=criteo_capped`` and ``--config=small``: naive Keras fp32 and
   bf16, tf_dlrm fp32, ``--amp`` and ``--xla``, interleaved in one process (on ``small`` also the
   MLPs alone, ``mlp_only_fp32``: the ceiling of any DLRM of that config);
2. ``loader_throughput.py --config=criteo_capped``: the reader alone, cold and warm page cache;
3. ``scaling.py --config=criteo_capped``: ``-np 1`` vs ``-np 2``, same global batch, alternating,
   and 2 independent processes with no exchange (the ceiling of ``-np 2`` on the machine);
4. with ``--with_preprocess``: ``preprocess_throughput.py`` (slow; off by default).

``--output`` gets a JSON list of every record, then one ``{"benchmark": "targets", ...}`` record
with the issue's targets and whether this run met them, and the ceilings measured beside them; the same lines go to stdout, and a
markdown table of the figures to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPOSITORY = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from emit import emit, machine  # noqa: E402

SMALL_CASES = "naive_fp32,naive_bf16,tf_dlrm_fp32,tf_dlrm_amp,tf_dlrm_xla,mlp_only_fp32"
QUICK = {  # for a fast look (and the smoke test), not for figures
    "train": ["--windows=2", "--window_steps=2", "--warmup_steps=1", "--num_batches=2"],
    "loader": ["--num_samples=32768", "--windows=1"],
    "scaling": ["--rounds=1", "--windows=1", "--window_steps=2", "--warmup_steps=1", "--num_batches=2"],
}
FULL = {
    "train": ["--windows=7", "--window_steps=10", "--warmup_steps=5"],
    "loader": ["--num_samples=1048576", "--windows=5"],
    "scaling": ["--rounds=2", "--windows=5", "--window_steps=8", "--warmup_steps=5"],
}


def run(script: str, args: list[str], timeout: float) -> list[dict]:
    """Runs one benchmark script; returns the JSON objects it printed (one per line)."""
    command = [sys.executable, os.path.join(HERE, script), *args]
    print(f"[run_all] {' '.join(command[1:])}", file=sys.stderr, flush=True)
    started = time.time()
    completed = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=timeout,
                               env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    if completed.returncode != 0:
        raise RuntimeError(f"{script} failed with exit code {completed.returncode}:\n{completed.stderr[-4000:]}")
    records = [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]
    print(f"[run_all]   {len(records)} records in {time.time() - started:.0f} s", file=sys.stderr, flush=True)
    return records


def _median(records, **match) -> float | None:
    for record in records:
        if all(record.get(k) == v for k, v in match.items()):
            return record["samples_per_s"]["median"]
    return None


def _ratio(numerator, denominator):
    return round(numerator / denominator, 3) if numerator and denominator else None


def check_targets(records: list[dict], config: str = "criteo_capped", small: str = "small") -> dict:
    """The issue's "must show" figures, from this run's records."""
    train = [r for r in records if r["benchmark"] == "train_throughput"]
    checks = []

    def add(name, value, minimum):
        checks.append({"target": name, "value": value, "minimum": minimum, "met": value is not None and value >= minimum})

    naive = _median(train, config=config, impl="naive_keras", precision="fp32")
    ours = _median(train, config=config, impl="tf_dlrm", precision="fp32", xla=False)
    amp = _median(train, config=config, impl="tf_dlrm", precision="bf16", xla=False) or \
        _median(train, config=config, impl="tf_dlrm", precision="fp16", xla=False)
    add(f"{config}: tf_dlrm fp32 / naive fp32", _ratio(ours, naive), 1.15)
    add(f"{config}: tf_dlrm --amp / naive fp32", _ratio(amp, naive), 1.4)
    add(f"{small}: tf_dlrm fp32 / naive fp32",
        _ratio(_median(train, config=small, impl="tf_dlrm", precision="fp32", xla=False),
               _median(train, config=small, impl="naive_keras", precision="fp32")), 1.5)
    # Not targets: what no implementation could exceed on this machine, measured in the same run.
    ceilings = []
    mlp_only = _median(train, config=small, impl="mlp_only")
    if mlp_only:
        ceilings.append({"ceiling": f"{small}: the two MLPs alone / naive fp32",
                         "value": _ratio(mlp_only, _median(train, config=small, impl="naive_keras", precision="fp32"))})
    loader = [r for r in records if r["benchmark"] == "loader_throughput" and r["config"] == config]
    consumed = max([v for v in (ours, amp) if v] or [0])
    for record in loader:
        add(f"{config}: loader ({record['cache']} cache) / fastest tf_dlrm trainer",
            _ratio(record["samples_per_s"]["median"], consumed), 10.0)
    for record in records:
        if record["benchmark"] == "scaling" and record["config"] == config and record["world_size"] == 2:
            add(f"{config}: -np 2 / -np 1 samples/s", record["vs_world_size_1"], 0.85)
            if "no_exchange_ceiling" in record:
                ceilings.append({"ceiling": f"{config}: 2 processes with no exchange / -np 1",
                                 "value": record["no_exchange_ceiling"]["vs_world_size_1"]})
            fraction = record["max_rank_embedding_fraction"]
            # A ceiling: expressed as 0.55 - fraction >= 0 so that "met" reads the same way.
            checks.append({"target": f"{config}: max per-rank embedding bytes at -np 2 / single process",
                           "value": fraction, "maximum": 0.55, "met": fraction is not None and fraction <= 0.55})
    return {"benchmark": "targets", "checks": checks, "all_met": all(c["met"] for c in checks), "ceilings": ceilings}


def markdown(records: list[dict]) -> str:
    lines = ["| benchmark | config | case | samples/s (median) | min | max | ratio |", "|---|---|---|---:|---:|---:|---:|"]
    for r in records:
        if r["benchmark"] == "train_throughput":
            case = f"{r['impl']} {r['precision']}" + (" xla" if r["xla"] else "")
            ratio = f"{r['vs_naive_fp32']} x naive fp32"
        elif r["benchmark"] == "loader_throughput":
            case, ratio = f"loader, {r['cache']} cache", ""
        elif r["benchmark"] == "scaling":
            case = f"-np {r['world_size']} ({r['intra_op_threads']} thread(s) each)"
            ratio = f"{r['vs_world_size_1']} x -np 1; max rank holds {r['max_rank_embedding_fraction']} of the tables"
        else:
            continue
        s = r["samples_per_s"]
        lines.append(f"| {r['benchmark']} | {r['config']} | {case} | {s['median']:,.0f} | {s['min']:,.0f} | {s['max']:,.0f} | {ratio} |")
        if r["benchmark"] == "scaling" and "no_exchange_ceiling" in r:
            c = r["no_exchange_ceiling"]
            lines.append(f"| scaling | {r['config']} | {r['world_size']} processes, no exchange | {c['samples_per_s']['median']:,.0f} | "
                         f"{c['samples_per_s']['min']:,.0f} | {c['samples_per_s']['max']:,.0f} | {c['vs_world_size_1']} x -np 1 |")
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default=os.path.join(HERE, "results.json"))
    parser.add_argument("--config", default="criteo_capped", help="the large config (tests use tiny)")
    parser.add_argument("--small_config", default="small")
    parser.add_argument("--quick", action="store_true", help="few short windows: a look, not figures")
    parser.add_argument("--skip_scaling", action="store_true")
    parser.add_argument("--with_preprocess", action="store_true", help="also run preprocess_throughput.py (slow)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per benchmark script")
    return parser.parse_args(argv)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    settings = QUICK if args.quick else FULL
    started = time.time()
    records = []
    for config in dict.fromkeys([args.config, args.small_config]):
        # On the small config the MLPs alone bound what any DLRM can reach: measured in the same run.
        cases = [f"--cases={SMALL_CASES}"] if config == args.small_config else []
        records += run("train_throughput.py", [f"--config={config}", *cases, *settings["train"]], args.timeout)
    records += run("loader_throughput.py", [f"--config={args.config}", *settings["loader"]], args.timeout)
    if not args.skip_scaling:
        records += run("scaling.py", [f"--config={args.config}", *settings["scaling"]], args.timeout)
    if args.with_preprocess:
        records += run("preprocess_throughput.py", [], args.timeout)
    targets = check_targets(records, args.config, args.small_config)
    targets.update({
        "command": " ".join([os.path.relpath(sys.argv[0], REPOSITORY), *(argv if argv is not None else sys.argv[1:])]),
        "seconds": round(time.time() - started),
        "machine": {"cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                    "processor": platform.processor() or platform.machine(), "python": platform.python_version()},
        "cpu": machine(),
    })
    records.append(targets)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output + ".partial", "w") as handle:
        json.dump(records, handle, indent=1)
        handle.write("\n")
    os.replace(args.output + ".partial", args.output)
    for record in records:
        emit(record)
    print(markdown(records), file=sys.stderr)
    for check in targets["checks"]:
        bound = f">= {check['minimum']}" if "minimum" in check else f"<= {check['maximum']}"
        print(f"[run_all] {'met    ' if check['met'] else 'NOT MET'} {check['target']}: {check['value']} ({bound})", file=sys.stderr)
    for ceiling in targets["ceilings"]:
        print(f"[run_all] ceiling {ceiling['ceiling']}: {ceiling['value']}", file=sys.stderr)
    return records


if __name__ == "__main__":
    main()
