r"""tf_dlrm against facebookresearch/dlrm (PyTorch, CPU) on the same model, one rank, taking turns.

    python benchmarks/peer_dlrm.py [--peer_python=../peer/venv/bin/python] \
        [--peer_script=../peer/dlrm/dlrm_s_pytorch.py] [--config=criteo_capped] [--rounds=3]

The peer runs in its own virtual environment, outside this project (nothing here imports torch):
its ``dlrm_s_pytorch.py`` with random one-hot data (``--data-generation=random``), the config's
tables (``--arch-embedding-size``), embedding width, bottom and top MLPs (the top MLP's input is
the dot interaction's ``D + F (F + 1) / 2`` plus nothing else, as in DLRM), batch and SGD learning
rate. Its own timer starts after each batch is fetched, so its ``ms/it`` lines time forward, loss,
backward and the SGD step, as tf_dlrm's figure does (``train_throughput.py``: batches held in
memory). Each round runs the peer, then tf_dlrm (``tf_dlrm_fp32`` and, unless ``--no-amp``,
``tf_dlrm_amp``); the peer's first ``--print_freq`` iterations are its warm-up and are dropped.

Prints one JSON line per round and one summary line (``"benchmark": "peer_dlrm"``) with the medians
over rounds, ``tf_dlrm_over_peer`` (goal >= 1.3) and ``amp_over_fp32`` (goal >= 1.3).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The peer (facebookresearch/dlrm and a torch venv) lives outside the project, beside the repository by default.
PEER = os.environ.get("TF_DLRM_PEER_DIR") or os.path.join(os.path.dirname(REPOSITORY), "peer")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from emit import emit  # noqa: E402
from train_throughput import CONFIGS  # noqa: E402

PEER_LINE = re.compile(r"Finished training it (\d+)/(\d+) of epoch \d+, ([0-9.]+) ms/it")


def table_rows(feature_spec: str) -> list[int]:
    import yaml

    with open(os.path.join(REPOSITORY, feature_spec)) as handle:
        spec = yaml.safe_load(handle)
    return [int(spec["feature_spec"][name]["cardinality"]) for name in spec["channel_spec"]["categorical"]]


def peer_arguments(config, learning_rate: float, iterations: int, print_freq: int) -> list[str]:
    rows = table_rows(config.feature_spec)
    vectors = len(rows) + 1
    top_input = config.embedding_dim + vectors * (vectors - 1) // 2
    return [
        f"--arch-sparse-feature-size={config.embedding_dim}",
        "--arch-embedding-size=" + "-".join(str(r) for r in rows),
        "--arch-mlp-bot=" + "-".join(str(d) for d in (13, *config.bottom_mlp_dims)),
        "--arch-mlp-top=" + "-".join(str(d) for d in (top_input, *config.top_mlp_dims)),
        "--arch-interaction-op=dot", "--data-generation=random",
        f"--mini-batch-size={config.batch_size}", f"--num-batches={iterations}",
        f"--data-size={config.batch_size * iterations}",
        "--num-indices-per-lookup=1", "--num-indices-per-lookup-fixed=True",
        f"--learning-rate={learning_rate}", f"--print-freq={print_freq}", "--print-time",
    ]


def parse_peer(output: str, print_freq: int) -> list[float]:
    """The peer's milliseconds per iteration, one figure per ``print_freq`` iterations, warm-up dropped."""
    figures = [(int(m.group(1)), float(m.group(3))) for m in PEER_LINE.finditer(output)]
    return [ms for done, ms in figures if done > print_freq]


def run_peer(args, config) -> dict:
    iterations = args.print_freq * (args.peer_groups + 1)
    command = [args.peer_python, args.peer_script, *peer_arguments(config, args.learning_rate, iterations, args.print_freq)]
    done = subprocess.run(command, cwd=os.path.dirname(args.peer_script), capture_output=True, text=True, timeout=args.timeout)
    per_iteration = parse_peer(done.stdout + done.stderr, args.print_freq)
    if done.returncode != 0 or not per_iteration:
        raise SystemExit(f"the peer failed (exit {done.returncode}); command: {' '.join(command)}\n{(done.stdout + done.stderr)[-3000:]}")
    rates = [config.batch_size / (ms / 1e3) for ms in per_iteration]
    return {"command": command, "ms_per_iteration": per_iteration, "samples_per_s": statistics.median(rates)}


def run_tf_dlrm(args) -> dict:
    cases = "tf_dlrm_fp32" + (",tf_dlrm_amp" if args.amp else "")
    command = [sys.executable, os.path.join(REPOSITORY, "benchmarks", "train_throughput.py"), f"--config={args.config}",
               f"--cases={cases}", f"--windows={args.windows}", f"--window_steps={args.window_steps}",
               f"--learning_rate={args.learning_rate}"]
    done = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=args.timeout)
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not records:
        raise SystemExit(f"tf_dlrm's benchmark failed (exit {done.returncode}): {' '.join(command)}\n{done.stderr[-3000:]}")
    return {"command": command, **{r["case"]: r["samples_per_s"]["median"] for r in records}}


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer_python", default=os.path.join(PEER, "venv", "bin", "python"),
                        help="python of a virtual environment with torch (CPU), outside this project")
    parser.add_argument("--peer_script", default=os.path.join(PEER, "dlrm", "dlrm_s_pytorch.py"),
                        help="dlrm_s_pytorch.py of a facebookresearch/dlrm checkout")
    parser.add_argument("--config", default="criteo_capped", choices=sorted(CONFIGS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--print_freq", type=int, default=5, help="peer iterations per timing line")
    parser.add_argument("--peer_groups", type=int, default=5, help="timed peer lines per round (after one warm-up line)")
    parser.add_argument("--windows", type=int, default=3, help="tf_dlrm windows per round")
    parser.add_argument("--window_steps", type=int, default=5)
    parser.add_argument("--learning_rate", type=float, default=0.05)
    parser.add_argument("--amp", action=argparse.BooleanOptionalAction, default=True, help="also time tf_dlrm --amp")
    parser.add_argument("--timeout", type=int, default=900)
    args = parser.parse_args(argv)
    for flag, path in (("--peer_python", args.peer_python), ("--peer_script", args.peer_script)):
        if not os.path.isfile(path):
            raise SystemExit(f"{flag}={path}: no such file. Set up the peer outside the project first (README, "
                             f"'tf_dlrm against facebookresearch/dlrm').")
    if args.rounds < 1 or args.print_freq < 1 or args.peer_groups < 1:
        raise SystemExit("--rounds, --print_freq and --peer_groups must be >= 1")
    config = CONFIGS[args.config]
    rounds = []
    for round_index in range(args.rounds):
        load_before = os.getloadavg()[0]
        peer = run_peer(args, config)
        mine = run_tf_dlrm(args)
        record = {"benchmark": "peer_dlrm_round", "config": args.config, "round": round_index,
                  "peer_samples_per_s": round(peer["samples_per_s"], 1), "peer_ms_per_iteration": peer["ms_per_iteration"],
                  "tf_dlrm_fp32_samples_per_s": mine["tf_dlrm_fp32"], "tf_dlrm_amp_samples_per_s": mine.get("tf_dlrm_amp"),
                  "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
        emit(record)
        rounds.append((record, peer["command"], mine["command"]))
    peer_median = statistics.median(r["peer_samples_per_s"] for r, _, _ in rounds)
    fp32_median = statistics.median(r["tf_dlrm_fp32_samples_per_s"] for r, _, _ in rounds)
    summary = {"benchmark": "peer_dlrm", "config": args.config, "batch_size": config.batch_size, "rounds": args.rounds,
               "peer": "facebookresearch/dlrm dlrm_s_pytorch.py (CPU)", "peer_samples_per_s": round(peer_median, 1),
               "tf_dlrm_fp32_samples_per_s": fp32_median, "tf_dlrm_over_peer": round(fp32_median / peer_median, 3),
               "peer_command": " ".join(rounds[0][1]), "tf_dlrm_command": " ".join(rounds[0][2]),
               "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if args.amp:
        amp_median = statistics.median(r["tf_dlrm_amp_samples_per_s"] for r, _, _ in rounds)
        summary.update({"tf_dlrm_amp_samples_per_s": amp_median, "amp_over_fp32": round(amp_median / fp32_median, 3)})
    emit(summary)
    return [r for r, _, _ in rounds] + [summary]


if __name__ == "__main__":
    main()
