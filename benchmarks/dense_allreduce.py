r"""The dense-gradient allreduce alone, over Gloo: one grouped call, one call per gradient (what the
trainer issues, each as soon as the backward pass produces it), and the bfloat16 mean of
``--amp`` (tf_dlrm.parallel.compressed_mean), under Horovod settings given per launch.

    python benchmarks/dense_allreduce.py [--config=criteo_capped] [--world_size=2] [--repeats=15]
        [--settings=default,HOROVOD_FUSION_THRESHOLD=0,HOROVOD_CYCLE_TIME=5]

The gradients have the shapes of the config's MLP weights (criteo_capped: 2.37M float32 values,
9.5 MB). Each setting is one ``horovodrun`` launch (``default`` sets nothing; otherwise
``NAME=VALUE[;NAME=VALUE]`` environment of the ranks). Prints one JSON object per setting and mode:
``{"benchmark": "dense_allreduce", "setting": ..., "mode": "grouped"|"per_gradient"|"bfloat16_mean",
"payload_bytes": ..., "sent_bytes_per_rank": ..., "ms": {"median", "min", "max"}, "sent_bytes_per_s": ...}``
(milliseconds per call on the slowest rank; ``sent_bytes_per_rank``: a ring's ``2 (N-1)/N P`` for
float32, ``(N-1)/N P`` for the bfloat16 mean).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODES = ("grouped", "per_gradient", "bfloat16_mean")


def gradient_shapes(config) -> list[tuple[int, ...]]:
    tables = 26
    vectors = tables + 1
    interaction = config.embedding_dim + vectors * (vectors - 1) // 2
    layers = list(zip((13, *config.bottom_mlp_dims[:-1]), config.bottom_mlp_dims))
    layers += list(zip((interaction, *config.top_mlp_dims[:-1]), config.top_mlp_dims))
    return [shape for fan_in, fan_out in layers for shape in ((fan_in, fan_out), (fan_out,))]


def worker(args) -> None:
    from train_throughput import CONFIGS

    from tf_dlrm.parallel import collectives
    from tf_dlrm.parallel import env as env_module

    env = env_module.initialize(force_horovod=True)
    import tensorflow as tf

    from tf_dlrm.parallel.compressed_mean import bfloat16_mean

    tf.config.threading.set_intra_op_parallelism_threads(1)
    shapes = gradient_shapes(CONFIGS[args.config])
    gradients = [tf.random.stateless_normal(s, seed=[env.rank, i]) for i, s in enumerate(shapes)]
    functions = {
        "grouped": tf.function(lambda g: collectives.grouped_mean(env, g, name="bench_grouped")),
        "per_gradient": tf.function(lambda g: [collectives.grouped_mean(env, [t], name=f"bench_gradient_{i}")[0] for i, t in enumerate(g)]),
        "bfloat16_mean": tf.function(lambda g: bfloat16_mean(env, g, "bench_bf16")),
    }
    times = {mode: [] for mode in MODES}
    for mode in MODES:
        [t.numpy() for t in functions[mode](gradients)]
    for _ in range(args.repeats):
        for mode in MODES:
            collectives.barrier(env)
            started = time.perf_counter()
            [t.numpy() for t in functions[mode](gradients)]
            times[mode].append(time.perf_counter() - started)
    with open(os.path.join(args.out_dir, f"rank{env.rank}.json"), "w") as handle:
        json.dump({"rank": env.rank, "times": times, "payload_bytes": sum(4 * int(tf.size(g)) for g in gradients)}, handle)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="criteo_capped")
    parser.add_argument("--world_size", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--settings", default="default,HOROVOD_FUSION_THRESHOLD=0,HOROVOD_CYCLE_TIME=5")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out_dir", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return []
    from emit import emit
    from train_throughput import REPOSITORY

    from tf_dlrm.parallel.compressed_mean import sent_bytes
    from tf_dlrm.sharding.traffic import ring_allreduce_sent

    out = []
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    for setting in args.settings.split(","):
        environment = {}
        if setting != "default":
            for pair in setting.split(";"):
                name, _, value = pair.partition("=")
                environment[name] = value
        with tempfile.TemporaryDirectory(prefix="tf_dlrm_allreduce_") as out_dir:
            command = [horovodrun, "-np", str(args.world_size), "-H", f"localhost:{args.world_size}", "--gloo", sys.executable,
                       os.path.abspath(__file__), "--worker", f"--out_dir={out_dir}", f"--config={args.config}",
                       f"--repeats={args.repeats}"]
            completed = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=900,
                                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **environment,
                                                PYTHONPATH=REPOSITORY + os.pathsep + os.environ.get("PYTHONPATH", "")))
            if completed.returncode != 0:
                raise SystemExit(f"horovodrun failed ({completed.returncode}):\n{(completed.stdout + completed.stderr)[-3000:]}")
            records = [json.load(open(os.path.join(out_dir, f"rank{r}.json"))) for r in range(args.world_size)]
        payload = records[0]["payload_bytes"]
        for mode in MODES:
            slowest = [max(values) * 1e3 for values in zip(*(r["times"][mode] for r in records))]
            sent = sent_bytes(payload, args.world_size) if mode == "bfloat16_mean" else ring_allreduce_sent(payload, args.world_size)
            median = statistics.median(slowest)
            record = {"benchmark": "dense_allreduce", "config": args.config, "world_size": args.world_size, "setting": setting,
                      "mode": mode, "payload_bytes": payload, "sent_bytes_per_rank": sent,
                      "ms": {"median": round(median, 2), "min": round(min(slowest), 2), "max": round(max(slowest), 2)},
                      "sent_bytes_per_s": round(sent / (median / 1e3))}
            emit(record)
            out.append(record)
    return out


if __name__ == "__main__":
    main()
