r"""Where each exchange option pays: main.py's byte-saving options beside the plain exchange on the
emulated cluster (``emulated_cluster.py``), across link bandwidths, interleaved in one job.

    python benchmarks/emulated_options.py --ranks=4 --bandwidths_mbit=200,1000,5000 [--repeats=5] [--steps=2]
        [--options=plain,dedup,hot_rows,...] [--batch_size=2048] [--seed=1] [--out=benchmarks/results/emulated_options.jsonl]

One cluster of ``--ranks`` namespaces; one job in it. Every rank builds, with main.py's own flags
(``tf_dlrm.cli.flags``) and session (``tf_dlrm.cli.modes.open_session``), one model and trainer per
option (:data:`OPTIONS`: its main.py flags), all on the same dataset: criteo_capped's shape
(``feature_specs/criteo_capped.yaml``, MLPerf's MLPs, dim 128) written by the synthetic generator with,
per table, the Zipf exponent fitted on the shared Criteo day-0 sample (:data:`CRITEO_FIT`). Then, for
each bandwidth in turn (the links reshaped between, the job's connections kept), ``--repeats`` rounds;
in each round every option in turn (the order rotated round by round) runs ``--steps`` fused training
steps (``Trainer.train_step``, as main.py's loop calls it) between barriers, then its dense-gradient
average alone (``_average_over_ranks`` of its replicated-table and MLP gradients: the allreduce phase)
and, where its embedding exchange is the plain alltoall of its send widths, that alltoall forward and
backward alone (the exchange phase; with ``--deduplicate_exchange`` or hot rows the exchange is theirs,
not timed alone). A turn's time is the slowest rank's; the figure is the median over rounds.

``compute`` is the fused step less the two phases timed alone (where both are): the lookup, the dense
forward/backward and the update, less what the fused step overlaps. Options under ``--amp`` are compared
with ``amp`` (bfloat16 compute, float32 allreduce), the others with ``plain``.

Prints and appends to ``--out`` one JSON line per (bandwidth, option) (``"benchmark":
"emulated_options"``), then one line per option with its crossover (``"benchmark":
"emulated_options_crossover"``): the bandwidth below which it is faster than its baseline, interpolated
on ``log bandwidth`` between the measured points where the ratio crosses 1.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
REPOSITORY = os.path.dirname(BENCHMARKS)
sys.path.insert(0, BENCHMARKS)
sys.path.insert(0, REPOSITORY)

# main.py flags of each option; "{ranks}" is replaced by the world size. plain is --dist_strategy=auto, which
# places criteo_capped's tables whole (table-wise) at 2-8 ranks: column_wise is its alternative.
OPTIONS = {
    "plain": [],
    "dedup": ["--deduplicate_exchange"],
    "hot_rows": ["--hot_rows_budget=0.1", "--hot_rows_min_per_step={ranks}"],
    "column_wise": ["--dist_strategy=column_wise"],
    "replicate_none": ["--data_parallel_rows=0"],
    "replicate_40k": ["--data_parallel_rows=40000"],
    "amp": ["--amp"],
    "amp_bf16_allreduce": ["--amp", "--bf16_dense_allreduce"],
}
BASELINE = {name: ("amp" if "--amp" in flags else "plain") for name, flags in OPTIONS.items()}
BASELINE["plain"] = BASELINE["amp"] = None

# Per table of feature_specs/criteo_capped.yaml (its order: cardinality, descending), the Zipf exponent
# fitted on the shared Criteo day-0 sample (benchmarks/scaling_model.py zipf_exponents, 1,000 rows) of the
# Criteo column of that capped cardinality: cat_0, 9, 10, 11, 19, 20, 21, 22 (capped at 100,000), 1, 4, 2,
# 23, 14, 3, 6, 13, 7, 17, 15, 24, 8, 25, 18, 12, 16, 5. cat_5 (3 ids) has no fit: uniform (0).
# The least-squares fit is biased low on a small sample (1M ids of Zipf 1.05 from our generator refit to 0.76).
CRITEO_FIT = (0.558, 0.6, 0.731, 0.37, 0.558, 0.608, 0.585, 0.523, 0.689, 0.905, 0.516, 0.608, 0.821, 1.03, 0.625,
              0.853, 1.067, 1.705, 2.321, 2.397, 2.208, 2.109, 2.26, 1.075, 2.378, 0.0)


def make_dataset(directory: str, batch_size: int, batches: int, seed: int, id_skew: str = "criteo_fit") -> str:
    """criteo_capped-shaped split_binary data; ids per table Zipf with :data:`CRITEO_FIT` (``id_skew``
    ``criteo_fit``) or one exponent ``S`` on every table (``zipf:S``); returns its directory."""
    from tf_dlrm.data.hidden_model import GeneratorConfig
    from tf_dlrm.data.synthetic import generate
    from tf_dlrm.spec.feature_spec import FeatureSpec

    spec = FeatureSpec.load(os.path.join(REPOSITORY, "feature_specs", "criteo_capped.yaml"), check_files=False)
    exponents = CRITEO_FIT if id_skew == "criteo_fit" else (float(id_skew.partition(":")[2]),) * len(CRITEO_FIT)
    generate(spec, directory, batch_size * batches, 0, seed, config=GeneratorConfig(feature_zipf_exponents=exponents))
    return directory


def option_argv(name: str, dataset: str, batch_size: int, ranks: int, seed: int) -> list[str]:
    # SGD: no optimizer state, so eight models fit on every rank (lazy Adam triples the tables' memory); the
    # options change what crosses the wire, not the update.
    return ["main.py", f"--dataset_path={dataset}", f"--batch_size={batch_size}", f"--seed={seed}", "--optimizer=sgd",
            *(flag.format(ranks=ranks) for flag in OPTIONS[name])]


# ---------------------------------------------------------------------- one rank


def worker(args) -> None:
    from absl import flags

    from tf_dlrm.cli import modes
    from tf_dlrm.cli.flags import config_from_flags, define_flags

    names = args.options.split(",")
    configs = []
    for name in names:
        values = flags.FlagValues()
        define_flags(None, values)
        values(option_argv(name, args.dataset, args.batch_size, args.ranks, args.seed))
        configs.append(config_from_flags(values))
    started = modes.start(configs[0])
    env = started[0]

    import tensorflow as tf

    from train_throughput import read_batch_features

    from tf_dlrm.data.reader import SplitBinaryReader
    from tf_dlrm.parallel import collectives

    local_batch = args.batch_size // env.world_size
    variants = []
    for name, config in zip(names, configs):
        session = modes.open_session(config, started)
        trainer, model = session.trainer, session.model
        embedding = model.embedding
        reader = SplitBinaryReader(session.spec, "train", args.batch_size, rank=env.rank, world_size=env.world_size,
                                   input_modes=model.input_modes)
        batches = [read_batch_features(reader, session.spec, b % reader.num_batches) for b in range(2)]
        reader.close()

        @tf.function
        def dense_gradients(features, label, trainer=trainer):
            _, _, tables, mlp = trainer._gradients(features, label, None)
            start = len(trainer.shards)
            replicated = [trainer.sparse.pack_replicated(g, v)
                          for g, v in zip(tables[start:start + len(trainer.replicated)], trainer.replicated)]
            return replicated + list(mlp) + [tf.zeros([])]

        @tf.function
        def allreduce(dense, trainer=trainer):
            return trainer._average_over_ranks(dense)

        plain_exchange = not (config.sharding.deduplicate_exchange or config.sharding.hot_rows_budget)
        exchange = send = None
        if plain_exchange:
            widths = list(embedding.send_widths)
            # Under bfloat16 the model sends 16-bit patterns (Horovod 0.28 has no bfloat16 alltoall): same bytes.
            dtype = tf.uint16 if model.compute_dtype == "bfloat16" else tf.float32

            @tf.function
            def exchange(flat, widths=widths, name=name):
                received = collectives.alltoall(env, flat, name=f"options_exchange_{name}")
                return collectives.alltoall(env, received, [local_batch * w for w in widths], name=f"options_back_{name}")

            send = tf.zeros([args.batch_size * widths[env.rank]], dtype)
        dense = dense_gradients(*batches[0])
        variant = {"name": name, "trainer": trainer, "batches": batches, "allreduce": lambda d=dense, f=allreduce: f(d),
                   "exchange": (lambda s=send, f=exchange: f(s)) if exchange else None,
                   "send_widths": list(getattr(embedding, "send_widths", [])),
                   "allreduce_payload_bytes": trainer.allreduce_payload_bytes(),
                   "replicated_tables": len(trainer.replicated), "plan": session.plan.describe() if session.plan else ""}
        for batch in batches:  # trace and warm the step and the phases
            _finish(trainer.train_step(*batch))
        _finish(variant["allreduce"]())
        if variant["exchange"]:
            _finish(variant["exchange"]())
        variants.append(variant)
        collectives.barrier(env)

    def timed(call) -> float:
        collectives.barrier(env)
        started_at = time.perf_counter()
        call()
        elapsed = time.perf_counter() - started_at
        collectives.barrier(env)
        return elapsed

    for phase in range(args.phases):
        go = os.path.join(args.control_dir, f"go_{phase}")
        while not os.path.exists(go):
            time.sleep(0.1)
        collectives.barrier(env)
        seconds = {v["name"]: {"step": [], "allreduce": [], "exchange": []} for v in variants}
        for repeat in range(args.repeats):
            turn = repeat % len(variants)
            for variant in variants[turn:] + variants[:turn]:
                trainer, batches = variant["trainer"], variant["batches"]

                def steps(trainer=trainer, batches=batches):
                    for index in range(args.steps):
                        _finish(trainer.train_step(*batches[index % len(batches)]))

                record = seconds[variant["name"]]
                record["step"].append(timed(steps) / args.steps)
                record["allreduce"].append(timed(lambda: _finish(variant["allreduce"]())))
                if variant["exchange"]:
                    record["exchange"].append(timed(lambda: _finish(variant["exchange"]())))
        out = {"rank": env.rank, "phase": phase, "seconds": seconds,
               "variants": {v["name"]: {k: v[k] for k in ("send_widths", "allreduce_payload_bytes", "replicated_tables")}
                            for v in variants}}
        if phase == 0 and env.rank == 0:
            out["plans"] = {v["name"]: v["plan"] for v in variants}
        with open(os.path.join(args.control_dir, f"rank{env.rank}_phase{phase}.json.partial"), "w") as handle:
            json.dump(out, handle)
        os.replace(os.path.join(args.control_dir, f"rank{env.rank}_phase{phase}.json.partial"),
                   os.path.join(args.control_dir, f"rank{env.rank}_phase{phase}.json"))
        collectives.barrier(env)
        if env.rank == 0:
            open(os.path.join(args.control_dir, f"done_{phase}"), "w").close()


def _finish(result) -> None:
    import tensorflow as tf

    tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, result)


# ---------------------------------------------------------------------- the driver


def crossover(points: list[tuple[float, float]]) -> dict:
    """``points``: (bandwidth, ratio to the baseline). The bandwidth below which the ratio is < 1."""
    points = sorted(points)
    wins = [ratio < 1 for _, ratio in points]
    if all(wins):
        return {"wins_below_mbit": None, "verdict": f"wins everywhere measured ({points[0][0]:g}-{points[-1][0]:g} Mbit/s)"}
    if not any(wins):
        return {"wins_below_mbit": None, "verdict": f"never at or above {points[0][0]:g} Mbit/s"}
    # The highest bandwidth after which it stops winning: the last change from a win to a loss going up.
    for (low, low_ratio), (high, high_ratio) in zip(points, points[1:]):
        if low_ratio < 1 <= high_ratio:
            fraction = (1 - low_ratio) / (high_ratio - low_ratio)
            at = math.exp(math.log(low) + fraction * (math.log(high) - math.log(low)))
            tail = "" if wins == sorted(wins, reverse=True) else " (not monotonic)"
            return {"wins_below_mbit": round(at, 1), "verdict": f"wins below about {at:,.0f} Mbit/s{tail}"}
    return {"wins_below_mbit": None, "verdict": "wins only above "
            f"{max(b for (b, r) in points if r >= 1):g} Mbit/s (loses below)"}


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def summarize(bandwidth: float, phase: int, control_dir: str, ranks: int, names: list[str], meta: dict) -> list[dict]:
    per_rank = []
    for rank in range(ranks):
        with open(os.path.join(control_dir, f"rank{rank}_phase{phase}.json")) as handle:
            per_rank.append(json.load(handle))
    records = []
    for name in names:
        def slowest(part):
            columns = list(zip(*(r["seconds"][name][part] for r in per_rank)))
            return [max(column) * 1e3 for column in columns]

        step, allreduce, exchange = slowest("step"), slowest("allreduce"), slowest("exchange")
        ms = {"step": round(statistics.median(step), 2), "allreduce": round(statistics.median(allreduce), 2),
              "exchange": round(statistics.median(exchange), 2) if exchange else None}
        ms["compute"] = round(ms["step"] - ms["allreduce"] - ms["exchange"], 2) if exchange else None
        variant = per_rank[0]["variants"][name]
        records.append({"benchmark": "emulated_options", "option": name, "flags": OPTIONS[name], "baseline": BASELINE[name],
                        "world_size": ranks, "bandwidth_mbit": bandwidth, "ms": ms,
                        "step_ms_all": [round(x, 2) for x in step], **meta, **variant})
    by_name = {r["option"]: r for r in records}
    for record in records:
        base = by_name.get(record["baseline"]) if record["baseline"] else None
        record["ratio_to_baseline"] = round(record["ms"]["step"] / base["ms"]["step"], 4) if base else None
    return records


def table(path: str) -> str:
    """The markdown table of the ``emulated_options`` lines in ``path``: world size x bandwidth x option, with the
    ratio of medians and, from the rounds (``step_ms_all``, in round order), the range of the per-round ratios
    (each option's turn against its baseline's turn of the same round: the spread the machine's load leaves)."""
    def cell(value):
        return "-" if value is None else f"{value:g}"

    records = []
    with open(path) as handle:
        for line in handle:
            record = json.loads(line)
            if record.get("benchmark") == "emulated_options":
                records.append(record)
    rows = ["| N | link (Mbit/s) | id skew | seed | option | step (ms) | compute / exchange / allreduce (ms) | ratio to baseline "
            "(per round: min-max) |", "|---:|---:|---|---:|---|---:|---|---|"]
    for record in records:
        ms, ratio = record["ms"], record["ratio_to_baseline"]
        versus = "-"
        if ratio is not None:
            base = next(r for r in records if r["option"] == record["baseline"] and r["commit"] == record["commit"]
                        and r["world_size"] == record["world_size"] and r["bandwidth_mbit"] == record["bandwidth_mbit"]
                        and r["id_skew"] == record["id_skew"] and r["seed"] == record["seed"])
            rounds = [a / b for a, b in zip(record["step_ms_all"], base["step_ms_all"])]
            versus = f"{ratio:.2f} of {record['baseline']} ({min(rounds):.2f}-{max(rounds):.2f})"
        compute = ms["compute"] if ms["compute"] is None or ms["compute"] >= 0 else None  # phases alone above the step
        rows.append(f"| {record['world_size']} | {record['bandwidth_mbit']:g} | {record['id_skew']} | {record['seed']} | {record['option']} | "
                    f"{ms['step']:g} | {cell(compute)} / {cell(ms['exchange'])} / {cell(ms['allreduce'])} | {versus} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--bandwidths_mbit", default="200,1000,5000", help="link rates, each way, in turn")
    parser.add_argument("--options", default=",".join(OPTIONS))
    parser.add_argument("--batch_size", type=int, default=2048, help="global batch")
    parser.add_argument("--batches", type=int, default=8, help="training batches written (hot rows count their ids)")
    parser.add_argument("--repeats", type=int, default=5, help="rounds per bandwidth (the median is reported)")
    parser.add_argument("--steps", type=int, default=2, help="fused steps per option per round")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--id_skew", default="criteo_fit",
                        help="criteo_fit (per table, the exponents fitted on the Criteo day-0 sample) or zipf:S (every table)")
    parser.add_argument("--prefix", default="tfdlopt")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                        help="each rank on its share of the machine's cores (emulated_cluster.host_cores)")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--out", default=os.path.join(BENCHMARKS, "results", "emulated_options.jsonl"))
    parser.add_argument("--table", metavar="JSONL", help="print the markdown table of a results file and exit")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--control_dir", help=argparse.SUPPRESS)
    parser.add_argument("--dataset", help=argparse.SUPPRESS)
    parser.add_argument("--phases", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.table:
        print(table(args.table))
        return 0
    if args.worker:
        worker(args)
        return 0
    from emulated_cluster import ClusterError, EmulatedCluster, _raise_interrupt
    import signal

    names = args.options.split(",")
    unknown = [n for n in names if n not in OPTIONS]
    if unknown or "plain" not in names or ("amp" not in names and any(BASELINE[n] == "amp" for n in names)):
        print(f"emulated_options: Expected --options from {list(OPTIONS)}, with each option's baseline (plain, amp). "
              f"Received: --options={args.options}", file=sys.stderr)
        return 2
    bandwidths = [float(b) for b in args.bandwidths_mbit.split(",")]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPOSITORY, capture_output=True, text=True).stdout.strip()
    signal.signal(signal.SIGTERM, _raise_interrupt)
    records = []
    try:
        with tempfile.TemporaryDirectory(prefix="tf_dlrm_options.") as work:
            dataset = make_dataset(os.path.join(work, "data"), args.batch_size, args.batches, args.seed, args.id_skew)
            control = os.path.join(work, "control")
            os.mkdir(control)
            with EmulatedCluster(args.ranks, bandwidths[0], 0.0, args.prefix, args.pin) as cluster:
                env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                           PYTHONPATH=REPOSITORY + os.pathsep + os.environ.get("PYTHONPATH", ""))
                command = [sys.executable, os.path.abspath(__file__), "--worker", f"--control_dir={control}",
                           f"--dataset={dataset}", f"--phases={len(bandwidths)}", f"--options={args.options}",
                           f"--ranks={args.ranks}", f"--batch_size={args.batch_size}", f"--repeats={args.repeats}",
                           f"--steps={args.steps}", f"--seed={args.seed}"]
                results = {}
                job = threading.Thread(target=lambda: results.update(out=cluster.run(command, env=env, timeout=args.timeout)),
                                       daemon=True)
                job.start()
                for phase, bandwidth in enumerate(bandwidths):
                    if phase:
                        cluster.reshape(bandwidth)
                    started = time.time()
                    load_before = load_average()
                    open(os.path.join(control, f"go_{phase}"), "w").close()
                    while not os.path.exists(os.path.join(control, f"done_{phase}")):
                        if not job.is_alive():
                            break
                        time.sleep(0.2)
                    if not os.path.exists(os.path.join(control, f"done_{phase}")):
                        break
                    meta = {"seed": args.seed, "global_batch_size": args.batch_size, "repeats": args.repeats,
                            "steps_per_turn": args.steps, "config": "criteo_capped", "id_skew": args.id_skew,
                            "commit": commit, "load_average_before": load_before, "load_average_after": load_average(),
                            "phase_wall_s": round(time.time() - started, 1)}
                    for record in summarize(bandwidth, phase, control, args.ranks, names, meta):
                        records.append(record)
                        print(json.dumps(record), flush=True)
                job.join(timeout=args.timeout)
                codes = [code for code, _ in results.get("out", [])]
                if len(codes) != args.ranks or any(codes):
                    tail = results.get("out", [(None, "")])[0][1][-3000:] if results.get("out") else ""
                    raise ClusterError(f"the ranks exited with {codes}:\n{tail}")
                if os.path.exists(os.path.join(control, "rank0_phase0.json")):
                    plans = json.load(open(os.path.join(control, "rank0_phase0.json"))).get("plans", {})
                    for name, plan in plans.items():
                        print(f"plan of {name}:\n{plan}", file=sys.stderr)
    except ClusterError as error:
        print(f"emulated_options: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("emulated_options: interrupted; the namespaces were removed", file=sys.stderr)
        return 130
    lines = list(records)
    for name in names:
        points = [(r["bandwidth_mbit"], r["ratio_to_baseline"]) for r in records if r["option"] == name and r["ratio_to_baseline"]]
        if points:
            line = {"benchmark": "emulated_options_crossover", "option": name, "baseline": BASELINE[name],
                    "world_size": args.ranks, "id_skew": args.id_skew, "ratios": dict((f"{b:g}", r) for b, r in points),
                    **crossover(points), "commit": commit}
            lines.append(line)
            print(json.dumps(line), flush=True)
    if args.out:
        with open(args.out, "a") as handle:
            for line in lines:
                handle.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
