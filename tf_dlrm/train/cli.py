"""``main.py``: train, evaluate, benchmark inference or export DLRM; ``horovodrun -np N`` for N ranks."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags

from tf_dlrm.precision import choose_precision, read_cpu_info
from tf_dlrm.distributed.traffic import describe as describe_traffic
from tf_dlrm.train.flags import RunConfig, config_from_flags, define_flags
from tf_dlrm.train.session import configure_threads, report_precision, resolve_spec_path  # noqa: F401 (benchmarks import them here)

define_flags()
FLAGS = flags.FLAGS


def run_training(config: RunConfig, stop=None) -> dict:
    """The whole run on this rank; returns the final record (the last JSON log line).

    ``stop``: the run's :class:`tf_dlrm.train.interrupt.SignalStop` (None: signals are not handled).
    """
    from tf_dlrm.distributed import env as env_module
    from tf_dlrm.train import interrupt, preflight

    preflight.check_output_paths(config)  # before anything costly: no mistake in a path costs a run
    env = env_module.initialize()
    config.check_world_size(env.world_size)
    intra, inter = configure_threads(config, env.local_size)

    import tensorflow as tf

    from tf_dlrm.feature_spec import FeatureSpec
    from tf_dlrm.model.interaction import interaction_paths
    from tf_dlrm.train import builder, checkpoint_choice
    from tf_dlrm.train.checkpoint import Checkpointer
    from tf_dlrm.train.loop import train
    from tf_dlrm.train.reporting import Reporter
    from tf_dlrm.train.step import Trainer

    spec = FeatureSpec.load(resolve_spec_path(config), check_files=config.dataset_type == "tf_raw")
    evaluating = preflight.check_valid_split(config, spec)
    choice = builder.apply_precision(choose_precision(config.amp, bool(tf.config.list_physical_devices("GPU"))))
    policy = choice.policy
    plan = builder.make_sharding_plan(spec, config.model, config.sharding, env.world_size)
    model = builder.build_model(spec, plan, config.model, env, config.seed, config.sharding.data_parallel_input)
    trainer = Trainer(model, env, config.optimizer, jit_compile=config.xla)
    trainer.broadcast_initial_state()

    reporter = Reporter(env.is_chief, config.log_path, config.tensorboard_dir)
    rank_bytes = [plan.rank_bytes(r) for r in range(env.world_size)]
    exchange = plan.alltoall_bytes_per_step(config.batch_size, bytes_per_value=2 if policy != "float32" else 4)
    traffic = step_traffic_of(trainer, config.batch_size, env.world_size)
    report_precision(reporter, config, choice)
    reporter.say(plan.describe())
    reporter.say(describe_traffic(traffic))
    reporter.event(
        "config",
        world_size=env.world_size,
        precision=policy,
        amp=config.amp.value,
        precision_native=choice.native,
        cpu=read_cpu_info().summary(),
        xla=config.xla,
        batch_size=config.batch_size,
        intra_op_threads=intra,
        inter_op_threads=inter,
        plan=plan.to_dict(),
        rank_embedding_bytes=rank_bytes,
        alltoall_bytes_per_step=exchange,
        bytes_per_step_per_rank=[t.to_dict() for t in traffic],
    )
    # After the config event, which stays the log's first line.
    paths = interaction_paths(model.interaction, config.xla)
    reporter.event("interaction", **paths)
    reporter.say(f"interaction: training {paths['training']}, evaluation {paths['evaluation']}"
                 + "".join(f"; {reason}" for reason in paths["reasons"]))
    reporter.say(
        f"world size {env.world_size}, precision {policy}, per-rank embedding bytes {rank_bytes}, "
        f"alltoall bytes per step (max over ranks) {exchange}"
    )

    embedding = model.embedding
    train_reader = builder.make_reader(spec, config.train_split, config.batch_size, env, embedding, True, config.seed, config.dataset_type)
    valid_reader = None
    if evaluating:
        # Random in-memory batches (--dataset_type=synthetic) are evaluated on the spec's split files.
        valid_type = "split_tfrecords" if config.dataset_type == "split_tfrecords" else "tf_raw"
        valid_reader = builder.make_reader(spec, config.valid_split, config.valid_batch_size, env, embedding, False,
                                           config.seed, valid_type)
        preflight.check_not_empty(config.valid_split, valid_reader)
    checkpointer = Checkpointer.from_config(config, trainer, spec, env, reporter)
    data = checkpoint_choice.data_record(train_reader, config.batch_size)
    start_step = checkpointer.restore_for_training(config, train_reader.num_batches, data)
    keeper = None
    if config.keep_best and valid_reader is not None:
        from tf_dlrm.train.keep_best import BestKeeper

        keeper = BestKeeper(trainer)

    def on_step(step, epoch, batch_in_epoch):
        checkpointer.on_step(step, epoch, batch_in_epoch)
        if stop is not None:
            stop.poll(trainer, env, step)

    if stop is not None:
        stop.training = True  # from now on a signal is only recorded, and the loop stops after a step
    try:
        result = train(trainer, train_reader, valid_reader, config.loop, reporter, start_step=start_step, on_step=on_step,
                       on_eval=keeper.on_eval if keeper else None)
    except interrupt.Interrupted as interrupted:
        checkpointer.finish(interrupted.step)  # saves unless that step is saved already (or no save path)
        last = checkpoint_choice.latest(config.save_checkpoint_path) or config.restore_checkpoint_path
        reporter.event("interrupted", step=interrupted.step, signal=interrupted.signal_number, checkpoint=last)
        reporter.close()
        interrupt.report(interrupted, last, env.is_chief)
        raise SystemExit(interrupted.exit_code) from None
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


def step_traffic_of(trainer, global_batch_size: int, world_size: int):
    """Every rank's alltoall and allreduce bytes per step (:mod:`tf_dlrm.distributed.traffic`).
    The ids' alltoall of ``--data_parallel_input`` is not counted (ids, not embeddings)."""
    from tf_dlrm.distributed.traffic import step_traffic

    embedding = trainer.model.embedding
    widths = list(embedding.send_widths) if embedding.exchanges and world_size > 1 else [0] * world_size
    value_bytes = 2 if trainer.model.compute_dtype in ("bfloat16", "float16") else 4
    return step_traffic(widths, global_batch_size, value_bytes, trainer.allreduce_payload_bytes() if world_size > 1 else 0)


def main(argv):
    del argv
    from tf_dlrm.train.interrupt import Interrupted, SignalStop

    stop = SignalStop().install()
    try:
        config = config_from_flags(FLAGS)
        if config.mode == "train":
            run_training(config, stop)
        else:
            from tf_dlrm.train import modes

            modes.run(config)
    except Interrupted as interrupted:  # before the first step (or outside training): nothing to save
        if os.environ.get("HOROVOD_RANK", "0") == "0":
            when = "before training started" if FLAGS.mode == "train" else f"(--mode={FLAGS.mode})"
            print(f"interrupted {when}; nothing was saved", file=sys.stderr, flush=True)
        sys.exit(interrupted.exit_code)
    except (ValueError, OSError) as error:
        _fail(str(error))
    except Exception as error:  # noqa: BLE001: a data error raised inside tf.data comes wrapped in a TF error
        from tf_dlrm.data.validation import message_of
        from tf_dlrm.train.interrupt import lost_rank_message

        message = message_of(error)
        if message is not None:
            _fail(message)
        lost = lost_rank_message(error)
        if lost is None:
            raise
        _fail(lost, code=1)  # not 2: nothing wrong with the input or flags, a restart may succeed


def _fail(message: str, code: int = 2) -> None:
    rank = os.environ.get("HOROVOD_RANK", "0")
    print(f"error (rank {rank}): {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def run():
    app.run(main)


if __name__ == "__main__":
    run()
