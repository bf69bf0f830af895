"""One rank of the scaling benchmark (run by ``benchmarks/scaling.py`` under ``horovodrun``).

Usage: ``horovodrun -np N python benchmarks/scaling_worker.py SPEC_YAML OUT_DIR CONFIG [--steps ...]``.

Every rank builds the sharded DLRM of ``CONFIG`` with the trainer's own defaults (sharding plan,
threads per rank: cores / ranks on the machine), reads its share of ``--num_batches`` global
batches into memory, runs ``--warmup_steps`` steps, then ``--windows`` windows of
``--window_steps`` steps, and writes ``OUT_DIR/rank<r>.json`` with its window timings and the
bytes of embedding values it holds.
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
    args = parser.parse_args(argv)

    from train_throughput import CONFIGS, configure_threads

    from tf_dlrm.distributed import collectives
    from tf_dlrm.distributed import env as env_module

    env = env_module.initialize(force_horovod=True)
    intra, inter = configure_threads(0, 0, env.local_size)

    import numpy as np
    import tensorflow as tf

    from tf_dlrm.data.reader import SplitBinaryReader
    from tf_dlrm.feature_spec import FeatureSpec
    from tf_dlrm.train import builder
    from tf_dlrm.train.schedule import LearningRateSchedule
    from tf_dlrm.train.step import OptimizerConfig, Trainer

    config = CONFIGS[args.config]
    spec = FeatureSpec.load(args.spec)
    model_config = builder.ModelConfig(config.embedding_dim, config.bottom_mlp_dims, config.top_mlp_dims)
    plan = builder.make_sharding_plan(spec, model_config, builder.ShardingConfig(), env.world_size)
    model = builder.build_model(spec, plan, model_config, env, args.seed)
    trainer = Trainer(model, env, OptimizerConfig(LearningRateSchedule(args.learning_rate)))
    trainer.broadcast_initial_state()
    embedding = model.embedding

    reader = SplitBinaryReader(
        spec, "train", config.batch_size, rank=env.rank, world_size=env.world_size,
        global_categorical=embedding.global_categorical, local_categorical=embedding.local_categorical,
    )
    batches = []
    for batch in range(args.num_batches):
        numerical, categorical, label = reader.read_batch(batch)
        batches.append((tf.constant(numerical), tuple(tf.constant(c) for c in categorical), tf.constant(label)))
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
    seconds = []
    for _ in range(args.windows):
        collectives.barrier(env)  # every window starts together on all ranks
        seconds.append(run(args.window_steps))
    held = sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in embedding.sparse_variables + embedding.dense_variables)
    record = {
        "rank": env.rank,
        "world_size": env.world_size,
        "intra_op_threads": intra,
        "inter_op_threads": inter,
        "global_batch_size": config.batch_size,
        "window_steps": args.window_steps,
        "window_seconds": seconds,
        "embedding_bytes": held,
        "plan_rank_bytes": plan.rank_bytes(env.rank),
        "plan_total_bytes": plan.total_bytes(),
    }
    with open(os.path.join(args.out_dir, f"rank{env.rank}.json"), "w") as handle:
        json.dump(record, handle)


if __name__ == "__main__":
    main()
