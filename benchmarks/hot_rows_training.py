r"""Hot rows in real training: ``horovodrun -np N main.py`` with and without ``--hot_rows_budget``.

    python benchmarks/hot_rows_training.py [--zipf_exponents=1.05,1.2] [--budget=0.1] [--world_size=2]
        [--spec=feature_specs/criteo_capped.yaml] [--batch_size=16384] [--steps=20]
        [--sync_every=1,4,16] [--num_valid_samples=M] [--seed=S] [--main_flags='--embedding_optimizer=sgd ...']

For each Zipf exponent: writes a synthetic dataset of the spec's shape whose ids follow Zipf's law
with that exponent (the generator's ``zipf_exponent``; tables of the spec, dim ``--embedding_dim``),
trains ``--steps`` steps at ``-np N`` once plainly and once with hot rows, and prints one JSON line
with what the run itself measured (the ``hot_rows_measured`` event: per rank hit rate and forward
bytes sent, cold rows + int32 codes, over the plain exchange's), the plan's expected hit rate and
hot bytes, and both runs' samples/s and final training loss. The id counts come from the training
split (``id_counts.npz``, written by the run).

Bounded staleness (``--sync_every=1,4,16``): one hot-row run per ``S`` of ``--hot_row_sync_every``
(same data, seed and plan), one JSON line each, with the hot rows' combine bytes per training step
(all ranks: the gradients' allgathers at ``S = 1``, the merges' allgathers otherwise) and the merges
counted. With ``--num_valid_samples > 0`` the dataset gets a validation split and every run ends
with an exact evaluation: the lines carry the final AUC of the plain run and of the hot-row run (the
forward byte counters then include that evaluation's lookups; the combine bytes are training only).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPOSITORY)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from emit import emit  # noqa: E402


def events(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.startswith("{")]


def train(args, dataset: str, log: str, extra: list[str]) -> list[dict]:
    command = [os.path.join(os.path.dirname(sys.executable), "horovodrun"), "-np", str(args.world_size), "--gloo", sys.executable, "main.py", f"--dataset_path={dataset}",
               f"--log_path={log}", f"--batch_size={args.batch_size}", f"--max_steps={args.steps}", "--epochs=1",
               f"--embedding_dim={args.embedding_dim}", f"--bottom_mlp_dims=64,{args.embedding_dim}", "--top_mlp_dims=64,1",
               "--print_freq=1000", *(["--evals_per_epoch=0"] if args.num_valid_samples else ["--valid_split=none"]),
               f"--seed={args.seed}", *args.main_flags.split(), *extra]
    done = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=args.timeout,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{(done.stdout + done.stderr)[-4000:]}")
    return events(log)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default="feature_specs/criteo_capped.yaml")
    parser.add_argument("--zipf_exponents", default="1.05,1.2")
    parser.add_argument("--budget", type=float, default=0.1)
    parser.add_argument("--world_size", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--embedding_dim", type=int, default=16)
    parser.add_argument("--num_train_samples", type=int, default=0, help="0: batch_size x steps")
    parser.add_argument("--work_dir", default="")
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument("--sync_every", default="1", help="--hot_row_sync_every values, one hot-row run each")
    parser.add_argument("--num_valid_samples", type=int, default=0, help="> 0: a validation split, final AUCs")
    parser.add_argument("--seed", type=int, default=12345, help="main.py's --seed (weights and data order)")
    parser.add_argument("--main_flags", default="", help="more main.py flags for every run, space-separated "
                        "(e.g. '--embedding_optimizer=sgd --embedding_learning_rate=1')")
    args = parser.parse_args(argv)
    sync_values = [int(v) for v in args.sync_every.split(",") if v]
    from tf_dlrm.data.hidden_model import GeneratorConfig
    from tf_dlrm.data.synthetic import generate
    from tf_dlrm.spec.feature_spec import FeatureSpec

    spec = FeatureSpec.load(os.path.join(REPOSITORY, args.spec), check_files=False)
    work = args.work_dir or tempfile.mkdtemp(prefix="hot_rows_training_")
    out = []
    for exponent in (float(e) for e in args.zipf_exponents.split(",") if e):
        dataset = os.path.join(work, f"zipf_{exponent:g}")
        if not os.path.exists(os.path.join(dataset, "feature_spec.yaml")):
            generate(spec, dataset, num_train_samples=args.num_train_samples or args.batch_size * args.steps,
                     num_valid_samples=args.num_valid_samples, seed=1, config=GeneratorConfig(zipf_exponent=exponent))
        plain = train(args, dataset, os.path.join(dataset, "plain.jsonl"), [])
        final_plain = [e for e in plain if e["event"] == "final"][-1]
        for every in sync_values:
            name = "hot.jsonl" if every == 1 else f"hot_sync_{every}.jsonl"
            hot = train(args, dataset, os.path.join(dataset, name),
                        [f"--hot_rows_budget={args.budget}", f"--hot_row_sync_every={every}"])
            record = summarize(args, exponent, every, hot, final_plain)
            emit(record)
            out.append(record)
    return out


def summarize(args, exponent: float, every: int, hot: list[dict], final_plain: dict) -> dict:
    """One JSON line: the plan, what the hot-row run measured, both runs' AUC and samples/s."""
    (plan,) = [e for e in hot if e["event"] == "hot_rows"]
    (measured,) = [e for e in hot if e["event"] == "hot_rows_measured"]
    final_hot = [e for e in hot if e["event"] == "final"][-1]
    steps = final_hot["steps"]
    combine = sum(r["hot_gradient_bytes_sent"] for r in measured["ranks"])
    return {
        "benchmark": "hot_rows_training", "spec": args.spec, "zipf_exponent": exponent, "world_size": args.world_size,
        "global_batch_size": args.batch_size, "steps": steps, "embedding_dim": args.embedding_dim,
        "budget": args.budget, "hot_row_sync_every": every, "merges": measured.get("merges"), "main_flags": args.main_flags,
        "hot_bytes": plan["hot_bytes"], "budget_bytes": plan["budget_bytes"],
        "expected_hit_rate": plan["expected_hit_rate"], "measured": measured["ranks"],
        "forward_bytes_ratio_max_rank": max(r["sent_ratio"] for r in measured["ranks"]),
        "exchanged_bytes_ratio": measured["exchanged_bytes_ratio"],
        "hot_combine_bytes_per_step": round(combine / steps, 1) if steps else None,
        # All bytes of both directions over the run (cold rows, codes, hot combine), per training step.
        "exchanged_bytes_per_step": round(measured["exchanged_bytes"] / steps, 1) if steps else None,
        "auc": {"plain": final_plain["auc"], "hot_rows": final_hot["auc"]},
        "samples_per_s": {"plain": final_plain["train_samples_per_s"], "hot_rows": final_hot["train_samples_per_s"]},
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


if __name__ == "__main__":
    main()
