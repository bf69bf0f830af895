"""One rank of the scaling benchmark (run by ``benchmarks/scaling.py`` under ``horovodrun``).

Usage: ``horovodrun -np N python benchmarks/scaling_worker.py SPEC_YAML OUT_DIR CONFIG [--steps ...]``.

Every rank builds the sharded DLRM of ``CONFIG`` with the trainer's own defaults (sharding plan,
threads per rank: cores / ranks on the machine), reads its share of ``--num_batches`` global
batches into memory, runs ``--warmup_steps`` steps, then ``--windows`` windows of
``--window_steps`` steps, and writes ``OUT_DIR/rank<r>.json`` with its window timings and the
bytes of embedding values it holds.

With ``--independent=R/N`` (run by ``scaling.py`` without ``horovodrun``) it is one of N plain
processes started together, each training its own single-process model on ``batch / N`` samples
per step with ``cores / N`` threads: what N ranks could do on this machine with no exchange at all.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spec")
    parser.add_argument("out_dir")
    parser.add_argument("config")
    parser.add_argument("--warmup_steps", type=int, default=5)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--window_steps", type=int, default=8)
    parser.add_argument("--num_batches", type=int, default=8)
    parser.add_argument("--learning_rate", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--batch_size", type=int, default=0, help="global batch (0: the config's)")
    parser.add_argument("--intra_op", type=int, default=0, help="intra-op threads per rank (0: the trainer's default)")
    parser.add_argument("--inter_op", type=int, default=0, help="inter-op threads per rank (0: the trainer's default)")
    parser.add_argument("--deduplicate_exchange", type=int, default=0,
                        help="1: build the embedding as main.py --deduplicate_exchange does")
    parser.add_argument("--hot_rows_budget", type=float, default=0.0,
                        help="> 0: replicate hot rows as main.py --hot_rows_budget does (id counts of the split's files)")
    parser.add_argument("--independent", type=str, default="",
                        help="RANK/N: one of N plain processes (no Horovod, no exchange) started together, "
                             "each training batch / N samples per step on cores / N threads")
    args = parser.parse_args(argv)

    from train_throughput import CONFIGS, configure_threads, read_batch_features

    from tf_dlrm.parallel import collectives
    from tf_dlrm.cli import cycle_time
    from tf_dlrm.parallel import env as env_module

    if args.independent:
        independent_rank, independent_count = (int(part) for part in args.independent.split("/"))
        cycle_line = None
        env = env_module.DistributedEnv()
        intra, inter = configure_threads(args.intra_op, args.inter_op, independent_count)
    else:
        independent_rank, independent_count = 0, 1
        # main.py's choice of Horovod's cycle time (a variant's HOROVOD_CYCLE_TIME wins, as it does there).
        config = CONFIGS[args.config]
        cycle_line = cycle_time.apply(None, config.bottom_mlp_dims, config.top_mlp_dims,
                                      args.batch_size or config.batch_size, env_module.launched_world_size())
        env = env_module.initialize(force_horovod=True)
        intra, inter = configure_threads(args.intra_op, args.inter_op, env.local_size)

    import numpy as np
    import tensorflow as tf

    from tf_dlrm.data.reader import SplitBinaryReader
    from tf_dlrm.spec.feature_spec import FeatureSpec
    from tf_dlrm.cli import builder, hot_rows_setup
    from tf_dlrm.cli.model_config import ModelConfig, ShardingConfig
    from tf_dlrm.models.dlrm import DLRMConfig
    from tf_dlrm.optimizers.settings import LearningRateSchedule
    from tf_dlrm.optimizers.settings import OptimizerConfig
    from tf_dlrm.train.step import Trainer

    config = CONFIGS[args.config]
    batch_size = (args.batch_size or config.batch_size) // independent_count
    spec = FeatureSpec.load(args.spec)
    model_config = ModelConfig(config.embedding_dim, params=DLRMConfig(config.bottom_mlp_dims, config.top_mlp_dims))
    plan = builder.make_sharding_plan(spec, model_config, ShardingConfig(), env.world_size)
    # --hot_rows_budget of main.py (None in one process or at budget 0).
    hot = hot_rows_setup.hot_row_plan(spec, plan, ShardingConfig(hot_rows_budget=args.hot_rows_budget), env,
                                      "train", batch_size * independent_count)
    # --deduplicate_exchange of main.py; in one process there is no exchange to deduplicate.
    model = builder.build_model(spec, plan, model_config, env, args.seed,
                                deduplicate_exchange=bool(args.deduplicate_exchange) and env.world_size > 1,
                                hot_rows=hot_rows_setup.as_layer_option(hot))
    trainer = Trainer(model, env, OptimizerConfig(LearningRateSchedule(args.learning_rate)))
    trainer.broadcast_initial_state()
    embedding = model.embedding

    reader = SplitBinaryReader(spec, "train", batch_size, rank=env.rank, world_size=env.world_size,
                               input_modes=model.input_modes)
    batches = [read_batch_features(reader, spec, batch) for batch in range(args.num_batches)]
    reader.close()

    position = 0

    def run(steps: int) -> float:
        nonlocal position
        started = time.perf_counter()
        for _ in range(steps):
            loss = trainer.train_step(*batches[position % len(batches)])
            position += 1
        loss.numpy()
        return time.perf_counter() - started

    run(args.warmup_steps)
    if args.independent:
        wait_for_all(args.out_dir, independent_rank, independent_count)
    seconds = []
    for _ in range(args.windows):
        collectives.barrier(env)  # every window starts together on all ranks
        seconds.append(run(args.window_steps))
    held = sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in embedding.sparse_variables + embedding.dense_variables)
    record = {
        "rank": independent_rank if args.independent else env.rank,
        "world_size": env.world_size,
        "independent_processes": independent_count if args.independent else 0,
        "intra_op_threads": intra,
        "inter_op_threads": inter,
        "global_batch_size": batch_size * independent_count,
        "window_steps": args.window_steps,
        "window_seconds": seconds,
        "embedding_bytes": held,
        "plan_rank_bytes": plan.rank_bytes(env.rank),
        "plan_total_bytes": plan.total_bytes(),
        "hot_rows_expected_hit_rate": round(hot.overall_hit_rate, 4) if hot else None,
        "horovod_cycle_time": cycle_line,
    }
    with open(os.path.join(args.out_dir, f"rank{record['rank']}.json"), "w") as handle:
        json.dump(record, handle)


def wait_for_all(out_dir: str, rank: int, count: int, timeout: float = 600.0) -> None:
    """A start line for independent processes: each announces itself, then waits for the others."""
    open(os.path.join(out_dir, f"ready{rank}"), "w").close()
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(os.path.join(out_dir, f"ready{r}")) for r in range(count)):
        if time.monotonic() > deadline:
            raise SystemExit(f"independent process {rank}: the other processes did not start within {timeout} s")
        time.sleep(0.01)


if __name__ == "__main__":
    main()
