"""``main.py``: train, evaluate, benchmark inference or export DLRM; ``horovodrun -np N`` for N ranks."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags

from tf_dlrm.train.flags import RunConfig, config_from_flags, define_flags

define_flags()
FLAGS = flags.FLAGS


def configure_threads(config: RunConfig, local_size: int) -> tuple[int, int]:
    """Ranks on one machine share its cores: by default each gets cores / local ranks intra-op
    threads (the matmuls), and two inter-op threads, so that independent ops (the bottom MLP and
    the embedding exchange, the backward pass and the gradient allreduces) overlap: at ``-np 2`` on
    2 cores two inter-op threads per rank measured about 5% faster than one."""
    import tensorflow as tf

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    intra = config.intra_op_parallelism or max(1, cores // max(1, local_size))
    inter = config.inter_op_parallelism or 2
    tf.config.threading.set_intra_op_parallelism_threads(intra)
    tf.config.threading.set_inter_op_parallelism_threads(inter)
    return intra, inter


def resolve_spec_path(config: RunConfig) -> str:
    if os.path.isabs(config.feature_spec) or not config.dataset_path:
        return config.feature_spec
    return os.path.join(config.dataset_path, config.feature_spec)


def run_training(config: RunConfig) -> dict:
    """The whole run on this rank; returns the final record (the last JSON log line)."""
    from tf_dlrm.distributed import env as env_module

    env = env_module.initialize()
    config.check_world_size(env.world_size)
    intra, inter = configure_threads(config, env.local_size)

    import tensorflow as tf

    from tf_dlrm.feature_spec import FeatureSpec
    from tf_dlrm.train import builder
    from tf_dlrm.train.checkpoint import Checkpointer
    from tf_dlrm.train.loop import train
    from tf_dlrm.train.reporting import Reporter
    from tf_dlrm.train.step import Trainer

    spec = FeatureSpec.load(resolve_spec_path(config), check_files=config.dataset_type == "tf_raw")
    on_gpu = bool(tf.config.list_physical_devices("GPU"))
    policy = builder.set_precision(config.amp, on_gpu)
    plan = builder.make_sharding_plan(spec, config.model, config.sharding, env.world_size)
    model = builder.build_model(spec, plan, config.model, env, config.seed, config.sharding.data_parallel_input)
    trainer = Trainer(model, env, config.optimizer, jit_compile=config.xla)
    trainer.broadcast_initial_state()

    reporter = Reporter(env.is_chief, config.log_path, config.tensorboard_dir)
    rank_bytes = [plan.rank_bytes(r) for r in range(env.world_size)]
    exchange = plan.alltoall_bytes_per_step(config.batch_size, bytes_per_value=2 if config.amp else 4)
    reporter.say(plan.describe())
    reporter.event(
        "config",
        world_size=env.world_size,
        precision=policy,
        xla=config.xla,
        batch_size=config.batch_size,
        intra_op_threads=intra,
        inter_op_threads=inter,
        plan=plan.to_dict(),
        rank_embedding_bytes=rank_bytes,
        alltoall_bytes_per_step=exchange,
    )
    reporter.say(
        f"world size {env.world_size}, precision {policy}, per-rank embedding bytes {rank_bytes}, "
        f"alltoall bytes per step (max over ranks) {exchange}"
    )

    embedding = model.embedding
    train_reader = builder.make_reader(spec, config.train_split, config.batch_size, env, embedding, True, config.seed, config.dataset_type)
    valid_reader = None
    if config.valid_split in spec.splits:
        valid_reader = builder.make_reader(spec, config.valid_split, config.valid_batch_size, env, embedding, False, config.seed)
    checkpointer = Checkpointer.from_config(config, trainer, spec, env, reporter)
    start_step = checkpointer.restore_for_training(config, train_reader.num_batches)
    keeper = None
    if config.keep_best and valid_reader is not None:
        from tf_dlrm.train.keep_best import BestKeeper

        keeper = BestKeeper(trainer)
    result = train(
        trainer, train_reader, valid_reader, config.loop, reporter, start_step=start_step, on_step=checkpointer.on_step,
        on_eval=keeper.on_eval if keeper else None,
    )
    last, final_step = result.last_eval, result.steps
    if keeper is not None and keeper.best is not None:
        keeper.restore()
        last, final_step = keeper.best, keeper.step
        reporter.say(f"keep_best: restored the state of step {keeper.step} (validation AUC {last.auc:.6f})")
    checkpointer.finish(final_step)

    final = {
        "auc": last.auc if last else None,
        "logloss": last.logloss if last else None,
        "train_samples_per_s": result.train_samples_per_s,
        "steps": result.steps,
        "world_size": env.world_size,
    }
    if keeper is not None:
        final["best_step"] = final_step
    reporter.summary(
        {
            "steps": result.steps,
            "world size": env.world_size,
            "precision": policy,
            "validation AUC": final["auc"],
            "validation logloss": final["logloss"],
            "train samples/s": final["train_samples_per_s"],
            "stopped early": result.stopped_early,
        }
    )
    reporter.event("final", **final)
    reporter.close()
    return final


def main(argv):
    del argv
    try:
        config = config_from_flags(FLAGS)
        if config.mode == "train":
            run_training(config)
        else:
            from tf_dlrm.train import modes

            modes.run(config)
    except (ValueError, OSError) as error:
        rank = os.environ.get("HOROVOD_RANK", "0")
        print(f"error (rank {rank}): {error}", file=sys.stderr, flush=True)
        sys.exit(2)


def run():
    app.run(main)


if __name__ == "__main__":
    run()
