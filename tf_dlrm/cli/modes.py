"""The modes of ``main.py``: ``--mode=train`` and what a checkpoint is for besides training.

- train: the training loop with periodic evaluation, checkpoints, signals and ``--keep_best``;
- eval: exact AUC, logloss, NE, calibration and positive rate of a checkpoint on the validation split
  and the test split, on any world size and plan;
- inference: latency (mean, p50, p90, p99) and throughput of the forward pass per global batch
  size, from a checkpoint (or the initial weights when none is given);
- export: a TF SavedModel with full tables and the one serving signature of every model, a library model's
  too (:mod:`tf_dlrm.cli.export` over :mod:`tf_dlrm.embedding.serving`; dynamic tables: their key maps,
  serving raw int64 keys).

Each prints a one-screen summary on rank 0 and logs JSON lines ending with a ``final`` record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

import numpy as np

from tf_dlrm.checkpoint import checkpointer as checkpoint
from tf_dlrm.checkpoint import lock as checkpoint_lock
from tf_dlrm.checkpoint import store as checkpoint_store
from tf_dlrm.embedding.training_step import embedding_layer
from tf_dlrm.io import files
from tf_dlrm.parallel import collectives, host_memory


@dataclasses.dataclass
class Session:
    """A built model on this rank, as the flags describe it."""

    config: object
    env: object
    spec: object
    policy: str
    model: object
    trainer: object
    reporter: object
    checkpointer: checkpoint.Checkpointer
    plan: object = None  # the ShardingPlan the model executes
    choice: object = None  # the PrecisionChoice of --amp here
    threads: tuple[int, int] = (0, 0)  # (intra-op, inter-op) TensorFlow threads
    memory: list = dataclasses.field(default_factory=list)  # RankMemory per rank (tf_dlrm.sharding.memory_plan)


def run(config, stop=None) -> dict:
    """Runs ``config.mode`` on this rank; returns the final record (the last JSON log line).

    ``stop``: the run's :class:`tf_dlrm.train.interrupt.SignalStop` (None: signals are not handled);
    only training polls it.
    """
    runners = {"train": lambda: run_train(config, stop), "eval": lambda: run_eval(config),
               "inference": lambda: run_inference(config), "export": lambda: run_export(config)}
    if config.mode not in runners:
        raise ValueError(f"Expected --mode in {list(runners)}. Received: --mode={config.mode}")
    return runners[config.mode]()


def start(config, check_spec=None):
    """This rank's env with threads configured, the feature spec, the reporter and the (intra, inter) threads.

    ``check_spec(spec)``: called before the reporter opens (and so truncates) ``--log_path``.
    """
    from tf_dlrm.parallel import env as env_module
    from tf_dlrm.parallel.devices import select_devices
    from tf_dlrm.spec.feature_spec import FeatureSpec
    from tf_dlrm.cli import cpu_allocator
    from tf_dlrm.cli.session import configure_threads, resolve_spec_path
    from tf_dlrm.train.reporting import Reporter

    cycle_line = None
    if env_module.launched_by_horovodrun():
        cycle_line = set_cycle_time(config)  # read by hvd.init
    env = env_module.initialize()
    config.check_world_size(env.world_size)
    device_line = select_devices(env, use_gpu=not config.cpu)  # before TensorFlow initialises its devices
    threads = configure_threads(config, env.local_size)
    spec = FeatureSpec.load(resolve_spec_path(config), check_files=config.dataset_type == "tf_raw")
    if config.dataset_type == "split_tfrecords":
        from tf_dlrm.data.split_tfrecords import ragged_by_default

        ragged_by_default(spec)  # NVIDIA's layout stores multi-hot rows ragged: hotness is their maximum
    if check_spec is not None:
        check_spec(spec)
    reporter = Reporter(env.is_chief, config.log_path, config.tensorboard_dir, log_format=config.log_format,
                        parameters=config.log_parameters)
    reporter.say(device_line)
    reporter.say(cpu_allocator.describe())
    for note in config.notes:
        reporter.say(f"note: {note}")
    outside = spec.files_outside()
    if outside:
        reporter.say(f"note: {spec.source} names {len(outside)} data file(s) outside its directory "
                     f"{spec.base_directory}: " + "; ".join(outside))
    if cycle_line and env.world_size > 1:
        reporter.say(cycle_line)
    return env, spec, reporter, threads


def set_cycle_time(config) -> str:
    """Sets Horovod's cycle time for this run's model and batch (:mod:`tf_dlrm.cli.cycle_time`)."""
    from tf_dlrm.cli import cycle_time
    from tf_dlrm.parallel.env import launched_world_size

    from tf_dlrm.cli import builder

    cls = builder.model_class(config.model)
    stacks = [] if builder.registry.is_library_model(cls) else cls.dense_stacks(builder.model_params(config.model))
    # cycle_time counts two stacks (DLRM's bottom and top MLPs); a model with one passes it as the top.
    bottom, top = (stacks[0], stacks[-1]) if len(stacks) > 1 else ((), stacks[0] if stacks else ())
    return cycle_time.apply(config.horovod_cycle_time_ms, bottom, top, config.batch_size, launched_world_size())


def open_session(config, started=None) -> Session:
    """Builds the model and trainer of the flags on this rank (collective with several ranks).

    ``started``: what :func:`start` returned, when the caller checked the spec before the build.
    """
    import tensorflow as tf

    from tf_dlrm.cli import builder, hot_rows_setup
    from tf_dlrm.train.step import Trainer

    from tf_dlrm.train.precision import choose_precision
    from tf_dlrm.cli.session import report_precision

    env, spec, reporter, threads = started or start(config)
    choice = builder.apply_precision(choose_precision(config.amp, bool(tf.config.list_physical_devices("GPU"))))
    report_precision(reporter, config, choice)
    # Every rank's host RAM and cgroup headroom, so that all ranks refuse a plan together, before any table exists.
    limits = host_memory.groups(collectives.allgather_json(env, host_memory.this_process(), "memory_limits"))
    if builder.registry.is_library_model(builder.model_class(config.model)):
        # A library model places its own tables (their TableConfig placements): built first, its plan read back.
        builder.check_library_sharding(config.model.name, config.sharding)
        hot = None
        model = builder.build_library_model(spec, config.model, env, config.seed)
        plan = embedding_layer(model).plan
        memory = builder.check_memory_plan(plan, config.optimizer, None, config.sharding.memory_per_rank,
                                           config.sharding.hot_row_sync_every, limits) if plan is not None else []
    else:
        plan = builder.make_sharding_plan(spec, config.model, config.sharding, env.world_size, config.optimizer)
        hot = hot_rows_setup.hot_row_plan(spec, plan, config.sharding, env, config.train_split, config.batch_size)
        memory = builder.check_memory_plan(plan, config.optimizer, hot, config.sharding.memory_per_rank,
                                           config.sharding.hot_row_sync_every, limits)
        model = builder.build_model(spec, plan, config.model, env, config.seed, config.sharding.data_parallel_input,
                                    deduplicate_exchange=config.sharding.deduplicate_exchange,
                                    hot_rows=hot_rows_setup.as_layer_option(hot),
                                    split_embedding_tables=config.sharding.split_embedding_tables, optimizer=config.optimizer)
    trainer = Trainer(model, env, config.optimizer, jit_compile=config.xla,
                      compress_dense_gradients=config.bf16_dense_allreduce,
                      hot_row_sync_every=config.sharding.hot_row_sync_every)
    # The dense part is known now: the budget covers it too (the same on every rank, so all refuse together).
    memory = builder.check_dense_memory(memory, trainer, config.sharding.memory_per_rank)
    trainer.broadcast_initial_state()
    checkpointer = checkpoint.Checkpointer.from_config(config, trainer, spec, builder.model_identity(config.model), env, reporter)
    if plan is not None:
        reporter.say(plan.describe())
    reporter.say("memory per rank (embedding tables, their optimizer state, hot rows, dense weights and their "
                 "optimizer state):\n  " + "\n  ".join(m.describe() for m in memory))
    hot_rows_setup.report_plan(reporter, hot, config.sharding.hot_row_sync_every)
    return Session(config, env, spec, choice.policy, model, trainer, reporter, checkpointer, plan, choice, threads, memory)


def restore(session: Session, required: bool = True) -> dict | None:
    """Loads the checkpoint the flags name into the session's model (not the optimizer state)."""
    config = session.config
    return session.checkpointer.restore(config.restore_checkpoint_path, resume=config.resume, required=required)


def _finish(session: Session, record: dict, summary: dict) -> dict:
    session.reporter.summary(summary)
    session.reporter.event("final", **record)
    session.reporter.close()
    return record


# ---------------------------------------------------------------------- train


def step_traffic_of(trainer, global_batch_size: int, world_size: int):
    """Every rank's alltoall and allreduce bytes per step (:mod:`tf_dlrm.sharding.traffic`).
    The ids' alltoall of ``--data_parallel_input`` is not counted (ids, not embeddings)."""
    from tf_dlrm.sharding.traffic import step_traffic

    embedding = embedding_layer(trainer.model)
    # Dynamic tables (tf_dlrm.embedding.dynamic) route keys by hash, so their bytes depend on the batch: not counted here.
    exchanges = getattr(embedding, "exchanges", False) and hasattr(embedding, "send_widths")
    widths = list(embedding.send_widths) if exchanges and world_size > 1 else [0] * world_size
    value_bytes = 2 if trainer.model.compute_dtype in ("bfloat16", "float16") else 4
    return step_traffic(widths, global_batch_size, value_bytes, trainer.allreduce_payload_bytes() if world_size > 1 else 0)


def run_train(config, stop=None) -> dict:
    """Trains on this rank; returns the final record (``auc``, ``logloss``, ``ne``, ``calibration``,
    ``positive_rate`` of the evaluated split named by ``split``, ``selected_on``, ``train_samples_per_s``, ``steps``,
    ``world_size``; with ``--keep_best`` or early stopping ``best_step``; with a test split (``test_split``)
    ``test_auc``, ``test_logloss``, ``test_ne``, ``test_calibration`` and ``test_positive_rate``)."""
    from tf_dlrm.sharding.traffic import describe as describe_traffic
    from tf_dlrm.train.precision import read_cpu_info
    from tf_dlrm.cli import builder, hot_rows_setup, preflight
    from tf_dlrm.checkpoint import checks as checkpoint_checks
    from tf_dlrm.train import interrupt
    from tf_dlrm.metrics import ClickMetrics
    from tf_dlrm.train.loop import evaluate, train

    preflight.check_output_paths(config)  # before anything costly: no mistake in a path costs a run
    resolved = []  # the splits evaluated: checked before the model is built
    session = open_session(config, start(config, lambda spec: resolved.append(preflight.check_splits(config, spec))))
    splits = resolved[0]
    env, spec, plan, trainer, reporter = session.env, session.spec, session.plan, session.trainer, session.reporter
    intra, inter = session.threads
    rank_bytes = [plan.rank_bytes(r) for r in range(env.world_size)]
    exchange = plan.alltoall_bytes_per_step(config.batch_size, bytes_per_value=2 if session.policy != "float32" else 4)
    traffic = step_traffic_of(trainer, config.batch_size, env.world_size)
    reporter.say(describe_traffic(traffic))
    reporter.event(
        "config", world_size=env.world_size, precision=session.policy, amp=config.amp.value,
        precision_native=session.choice.native, cpu=read_cpu_info().summary(), xla=config.xla,
        batch_size=config.batch_size, intra_op_threads=intra, inter_op_threads=inter, plan=plan.to_dict(),
        rank_embedding_bytes=rank_bytes, alltoall_bytes_per_step=exchange,
        bytes_per_step_per_rank=[t.to_dict() for t in traffic],
        # With it, the alltoall sends at most the bytes above (one row per distinct id per destination).
        deduplicate_exchange=config.sharding.deduplicate_exchange,
        memory_per_rank={"budget": config.sharding.memory_per_rank, "ranks": [dataclasses.asdict(m) | {"total": m.total}
                                                                             for m in session.memory]},
        hot_row_sync_every=config.sharding.hot_row_sync_every,
        split_embedding_tables=config.sharding.split_embedding_tables,
    )
    for event, fields in (session.model.describe(xla=config.xla) if hasattr(session.model, "describe") else {}).items():
        fields = dict(fields)
        line = fields.pop("line", None)
        reporter.event(event, **fields)  # after the config event: a log's first line stays config
        if line:
            reporter.say(line)
    reporter.say(
        f"world size {env.world_size}, precision {session.policy}, per-rank embedding bytes {rank_bytes}, "
        f"alltoall bytes per step (max over ranks) {exchange}"
    )

    inputs = session.model.input_modes
    train_reader = builder.make_reader(spec, config.train_split, config.batch_size, env, inputs, True, config.seed,
                                       config.dataset_type)
    valid_reader = None
    # Random in-memory batches (--dataset_type=synthetic) are evaluated on the spec's split files.
    valid_type = "split_tfrecords" if config.dataset_type == "split_tfrecords" else "tf_raw"
    if splits.valid:
        valid_reader = builder.make_reader(spec, splits.valid, config.valid_batch_size, env, inputs, False,
                                           config.seed, valid_type)
        preflight.check_not_empty(splits.valid, valid_reader)
    test_reader = None
    if splits.test:
        test_reader = builder.make_reader(spec, splits.test, config.valid_batch_size, env, inputs, False,
                                          config.seed, valid_type)
        preflight.check_not_empty(splits.test, test_reader, "test_split")
    checkpointer = session.checkpointer
    data = checkpoint_checks.data_record(train_reader, config.batch_size)
    start_step = checkpointer.restore_for_training(config, train_reader.num_batches, data)
    keeper = stopper = None
    if config.keep_best and valid_reader is not None:
        from tf_dlrm.train.early_stopping import EarlyStopping
        from tf_dlrm.train.keep_best import BestKeeper

        metric = config.loop.early_stopping_metric
        keeper = BestKeeper(trainer, config.loop.early_stopping_min_delta, metric)
        if config.loop.early_stopping_patience:
            stopper = EarlyStopping(config.loop.early_stopping_patience, config.loop.early_stopping_min_delta, metric)
        chosen = (checkpointer.restored or {}).get("selection") if config.resume else None
        if chosen and chosen.get("metric", "auc") != metric:
            reporter.say(f"keep_best: the checkpoint chose by {chosen.get('metric', 'auc')}, this run by {metric}: "
                         "the choice starts again from the next evaluation")
        elif chosen:  # a resumed run goes on choosing where the interrupted one was
            keeper.resume(chosen)
            if stopper is not None:
                stopper.resume(chosen)
            reporter.say(f"keep_best: the best evaluation before the resume was step {keeper.step} ({keeper.describe()})"
                         f"{f', {stopper.waited} evaluation(s) since' if stopper else ''}")
        checkpointer.selection = lambda: keeper.record(stopper.waited if stopper else None)

    delta_writer = None
    if config.delta_every_steps:
        from tf_dlrm.checkpoint.deltas import DeltaWriter

        delta_writer = DeltaWriter(trainer.model, env, config.delta_dir, config.delta_every_steps,
                                   getattr(trainer, "synchronize_hot_rows", None), reporter.say)
        delta_writer.start(start_step)

    def on_step(step, epoch, batch_in_epoch):
        with stop.paused() if stop is not None else contextlib.nullcontext():
            checkpointer.on_step(step, epoch, batch_in_epoch)
            if delta_writer is not None:
                delta_writer.on_step(step)
        if stop is not None:
            stop.poll(trainer, env, step)

    if stop is not None:
        stop.training = True  # from now on a signal is only recorded, and the loop stops after a step
        stop.last_checkpoint = lambda: checkpoint_checks.latest(config.save_checkpoint_path) or config.restore_checkpoint_path
        stop.watch_steps(True)
    try:
        result = train(trainer, train_reader, valid_reader, config.loop, reporter, start_step=start_step, on_step=on_step,
                       on_eval=keeper.on_eval if keeper else None, stopper=stopper,
                       evaluation=stop.paused if stop is not None else None)
    except interrupt.Interrupted as interrupted:
        stop.watch_steps(False)  # the stop is agreed: the save that follows takes the time it needs
        checkpointer.finish(interrupted.step)  # saves unless that step is saved already (or no save path)
        last = checkpoint_checks.latest(config.save_checkpoint_path) or config.restore_checkpoint_path
        if keeper is not None:
            _save_best_beside(keeper, checkpointer, interrupted.step)
        reporter.event("interrupted", step=interrupted.step, signal=interrupted.signal_number, checkpoint=last)
        reporter.close()
        interrupt.report(interrupted, last, env.is_chief)
        # horovodrun ends every rank still running as soon as one exits non-zero: a rank that left first
        # would cut the others' save or report short. All leave together, after everything is written.
        collectives.barrier(env)
        interrupt.exit_now(interrupted.exit_code)
    if stop is not None:
        stop.watch_steps(False)
    last, final_step = result.last_eval, result.steps
    chosen = keeper is not None and keeper.step is not None
    if chosen and keeper.in_memory:
        keeper.restore()
        last, final_step = keeper.best, keeper.step
        reporter.say(f"keep_best: restored the state of step {keeper.step} ({keeper.describe()})")
    elif chosen and keeper.step != result.steps:
        chosen = _restore_best_from_disk(keeper, checkpointer, config, reporter)
        if chosen:
            final_step = keeper.step
            last = evaluate(trainer, valid_reader, where=f"evaluation at step {final_step}",
                            max_batches=config.loop.eval_max_batches)
    calibrated = _fit_calibration(session, valid_reader, splits, final_step)
    if calibrated is not None:
        last = calibrated
    checkpointer.finish(final_step, chosen=chosen)  # with the calibration in its manifest
    tested = None
    if test_reader is not None:
        # Once, at the state selection chose: this figure never chose anything (nor fitted the calibration).
        tested = evaluate(trainer, test_reader, where=f"test evaluation at step {final_step}",
                          calibration=calibrated.calibration if calibrated is not None else None)
        reporter.say(f"test ({splits.test}) at step {final_step}: {tested.describe()}  ({tested.samples} samples)")
        reporter.event("final_test", step=final_step, split=splits.test, **tested.record())
        reporter.scalars(final_step, **{f"test_{name}": value for name, value in tested.metrics.as_dict().items()})
    model = session.model
    if getattr(embedding_layer(model), "dynamic_layer", None) is not None:
        # Rows, evictions and rejections of every dynamic table, summed over ranks (collective).
        counters = embedding_layer(model).dynamic_layer.global_counters()
        reporter.event("dynamic_tables", tables=counters)
        reporter.say("dynamic tables: " + ", ".join(
            f"{name} {c['rows']} rows, {c['evictions']} evictions, {c['rejections']} rejections" for name, c in counters.items()))

    hot_rows_setup.report_measured(reporter, embedding_layer(model), session.trainer)
    record = {
        **(last.metrics.as_dict() if last else dict.fromkeys(f.name for f in dataclasses.fields(ClickMetrics))),
        "train_samples_per_s": result.train_samples_per_s,
        "steps": result.steps,
        "world_size": env.world_size,
        # Which split each figure comes from: auc etc. of ``split``, the test_* of ``test_split``; ``selected_on``
        # names the split that chose the reported state or stopped the run (None: nothing chose).
        "split": splits.valid or None,
        "selected_on": splits.valid if valid_reader is not None and splits.selects and _selecting(config) else None,
    }
    if keeper is not None:
        record["best_step"] = final_step
    if last is not None:
        record.update(last.uncalibrated_fields())
    record["calibrated"] = _calibration_record(last, splits.valid, final_step)
    if last is not None and last.partial:
        record["partial"] = True
    summary = {
        "steps": result.steps, "world size": env.world_size, "precision": session.policy,
        "reported state": _reported_state(final_step, record["selected_on"], keeper, config),
        **_metric_lines(splits.valid_role, last, splits.valid),
        "calibration map": _describe_calibration(last, splits.valid),
        "train samples/s": record["train_samples_per_s"], "stopped early": result.stopped_early,
    }
    if tested is not None:
        record.update({f"test_{name}": value for name, value in tested.metrics.as_dict().items()})
        record.update(tested.uncalibrated_fields("test_"))
        record["test_split"] = splits.test
        summary.update(_metric_lines("test", tested, splits.test))
    return _finish(session, record, summary)


def _fit_calibration(session: Session, valid_reader, splits, step: int):
    """``--calibration``: fitted on the validation split at the reported state (one more pass over the split, the
    model's logits gathered on rank 0), kept for the final checkpoint's manifest; returns that evaluation (its
    ``metrics`` calibrated, ``uncalibrated`` the model's), or None when nothing was fitted (said in one line).
    Never fitted on a split that may not choose (the test split of a dataset without a validation split)."""
    from tf_dlrm.train.loop import evaluate

    config, reporter = session.config, session.reporter
    if config.calibration == "none" or valid_reader is None:
        return None
    if not splits.selects:
        reporter.say(f"calibration: not fitted: the evaluated split '{splits.valid}' is the held-out test split, which "
                     "fits nothing (give the dataset a validation split, docs/data.md); the figures are uncalibrated")
        return None
    result = evaluate(session.trainer, valid_reader, where=f"calibration at step {step}",
                      max_batches=config.loop.eval_max_batches, fit=config.calibration)
    if result.calibration is None:
        reporter.say(f"calibration: not fitted on {splits.valid}: {result.calibration_note}; the figures are uncalibrated")
        return None
    fitted, before = result.calibration, result.uncalibrated
    session.checkpointer.calibration = {**fitted.record(), "split": splits.valid, "step": int(step)}
    reporter.say(f"calibration fitted on {splits.valid} ({result.samples} samples) at step {step}: {fitted.describe()}; "
                 f"{splits.valid} logloss {before.logloss:.6f} -> {result.metrics.logloss:.6f}, NE {before.ne:.6f} -> "
                 f"{result.metrics.ne:.6f}, calibration {before.calibration:.4f} -> {result.metrics.calibration:.4f}")
    reporter.event("calibration", step=int(step), split=splits.valid, map=fitted.record(), **result.record())
    return result


def _calibration_record(result, split: str, step: int) -> dict | None:
    """The final record's ``calibrated``: the map applied to the figures (method, scale, shift) and where it was
    fitted; None: the figures are the model's own."""
    if result is None or result.calibration is None:
        return None
    return {**result.calibration.record(), "split": split, "step": int(step)}


def _describe_calibration(result, split: str) -> str:
    if result is None or result.calibration is None:
        return "none"
    return f"{result.calibration.describe()} (fitted on {split})"


def _selecting(config) -> bool:
    """Whether evaluations choose anything: the state (``--keep_best``, early stopping) or the last step (``--auc_threshold``)."""
    return config.keep_best or config.loop.auc_threshold is not None


def _reported_state(step: int, selected_on: str | None, keeper, config) -> str:
    """The summary's line saying which state the figures below are of, and what chose it."""
    if selected_on is None:
        return f"step {step}, the last (nothing chose it)"
    if keeper is not None:
        return f"step {step}, the best {config.loop.early_stopping_metric} on {selected_on}"
    return f"step {step}, the last (--auc_threshold watched {selected_on})"


# ---------------------------------------------------------------------- eval


def run_eval(config) -> dict:
    """The metrics of a checkpoint on the validation split (its first ``--eval_max_batches`` batches when
    given) and on the test split too (``test_auc`` etc.), as :mod:`tf_dlrm.cli.evaluation_splits` resolves them."""
    from tf_dlrm.cli import builder, evaluation_splits, preflight
    from tf_dlrm.train.loop import evaluate

    session = open_session(config)
    header = restore(session)
    available = preflight.available_splits(config, session.spec)
    resolved = evaluation_splits.resolve(config.valid_split, config.test_split, available)
    named = [(flag, split) for flag, split in (("valid_split", resolved.valid), ("test_split", resolved.test)) if split]
    if not named:
        raise ValueError(f"--mode=eval: --valid_split='{config.valid_split}' and --test_split='{config.test_split}' name "
                         f"no split of {session.spec.source} to evaluate (its splits: {available})")
    for flag, split in named:
        if split not in available:
            raise ValueError(f"--{flag}={split} is not a split of {session.spec.source}: {available}")
    calibration = checkpoint_calibration(header, config, session.reporter)
    results = []
    for index, (_, split) in enumerate(named):
        reader = builder.make_reader(
            session.spec, split, config.valid_batch_size, session.env, session.model.input_modes, False, config.seed,
            dataset_type=config.dataset_type,
        )
        results.append(evaluate(session.trainer, reader, max_batches=0 if index else config.loop.eval_max_batches,
                                calibration=calibration))
    result, role = results[0], resolved.valid_role if resolved.valid else "test"
    record = {
        "mode": "eval", **result.metrics.as_dict(), **result.uncalibrated_fields(), "samples": result.samples,
        "split": named[0][1], "checkpoint": header["path"], "steps": header["step"], "world_size": session.env.world_size,
        "train_samples_per_s": None,
        "calibrated": None if calibration is None else header["calibration"],
    }
    if result.partial:
        record["partial"] = True
    summary = {
        "checkpoint": header["path"], "step": header["step"], "world size": session.env.world_size,
        f"{role} samples": result.samples, **_metric_lines(role, result, named[0][1]),
        "calibration map": "none" if calibration is None else
        f"{calibration.describe()} (fitted on {header['calibration'].get('split', '?')})",
        "eval seconds": result.seconds,
    }
    if len(results) > 1:
        record.update({f"test_{name}": value for name, value in results[1].metrics.as_dict().items()})
        record.update(results[1].uncalibrated_fields("test_"))
        record["test_samples"] = results[1].samples
        record["test_split"] = resolved.test
        summary.update({"test samples": results[1].samples, **_metric_lines("test", results[1], resolved.test)})
    return _finish(session, record, summary)


def checkpoint_calibration(header: dict, config, reporter):
    """The calibration a checkpoint's manifest holds (:mod:`tf_dlrm.calibration`), None with ``--calibration=none``
    or when it holds none (said in one line)."""
    from tf_dlrm.calibration import Calibration

    record = header.get("calibration")
    if config.calibration == "none":
        return None
    if record is None:
        reporter.say(f"calibration: checkpoint {header['path']} holds none (saved during training, or by a run with "
                     "--calibration=none or without a validation split): the figures are uncalibrated")
        return None
    calibration = Calibration.from_record(record)
    if calibration.method != config.calibration:
        reporter.say(f"calibration: applying the checkpoint's {calibration.method} map (--calibration={config.calibration} "
                     "chooses what training fits; none turns it off here)")
    return calibration


def _metric_lines(role: str, result, split: str = "") -> dict:
    """Summary lines of one evaluation (None when there was none), labelled by the split's role and, when its
    name says something else, the split: ``validation AUC``, ``validation (valid) AUC``, ``test AUC``."""
    label = role if split in ("", role) else f"{role} ({split})"
    names = {"auc": "AUC", "logloss": "logloss", "ne": "NE", "calibration": "calibration", "positive_rate": "positive rate"}
    values = result.metrics.as_dict() if result is not None else dict.fromkeys(names)
    lines = {}
    for name, value in values.items():
        lines[f"{label} {names[name]}"] = value
        if result is not None and result.uncalibrated is not None and name in ("logloss", "ne", "calibration"):
            # The model's own figure, before the calibration (the AUC is the same).
            lines[f"{label} {names[name]} (uncalibrated)"] = getattr(result.uncalibrated, name)
    return lines


# ---------------------------------------------------------------------- inference


def latency_figures(seconds, batch_size: int) -> dict:
    """Mean and percentiles in milliseconds of per-batch latencies, and samples per second."""
    milliseconds = np.asarray(seconds, np.float64) * 1e3
    p50, p90, p95, p99 = np.percentile(milliseconds, [50, 90, 95, 99])
    mean = float(milliseconds.mean())
    return {
        "batch_size": batch_size, "batches": int(milliseconds.size), "mean_ms": mean, "p50_ms": float(p50),
        "p90_ms": float(p90), "p95_ms": float(p95), "p99_ms": float(p99), "samples_per_s": batch_size / (mean / 1e3),
    }


def _batches(session: Session, batch_size: int, count: int = 8):
    """Up to ``count`` distinct batches of this size, read ahead so disk time is not measured."""
    from tf_dlrm.cli import builder

    spec, config = session.spec, session.config
    from tf_dlrm.cli.evaluation_splits import resolve

    valid = resolve(config.valid_split, config.test_split, spec.splits).valid
    split = valid if valid in spec.splits else config.train_split
    reader = builder.make_reader(
        spec, split, batch_size, session.env, session.model.input_modes, False, config.seed, dataset_type=config.dataset_type
    )
    batches = [features for features, _ in reader.dataset(epoch=0).take(count)]
    if not batches:
        raise ValueError(f"--inference_batch_sizes={batch_size}: the {split} split has no batch of that size to time")
    return batches


def run_inference(config, warmup: int = 5) -> dict:
    import tensorflow as tf

    session = open_session(config)
    header = restore(session, required=False)
    if header is None:
        session.reporter.say("no checkpoint given: timing the initial weights")
    model = session.model
    forward = tf.function(lambda features: tf.sigmoid(model(features, training=False)))
    timed = config.loop.max_steps if config.loop.max_steps > 0 else 100
    results = []
    for batch_size in config.inference_batch_sizes:
        batches = _batches(session, batch_size)
        seconds = []
        for index in range(warmup + timed):
            features = batches[index % len(batches)]
            started = time.perf_counter()
            forward(features).numpy()  # .numpy() waits for the result
            if index >= warmup:
                seconds.append(time.perf_counter() - started)
        figures = latency_figures(seconds, batch_size)
        results.append(figures)
        session.reporter.event("inference", world_size=session.env.world_size, precision=session.policy, **figures)
    session.reporter.say(format_latency_table(results))
    record = {
        "mode": "inference", "results": results, "checkpoint": header["path"] if header else None,
        "world_size": session.env.world_size, "precision": session.policy,
    }
    summary = {"checkpoint": record["checkpoint"], "world size": session.env.world_size, "precision": session.policy}
    summary.update({f"batch {r['batch_size']} samples/s": r["samples_per_s"] for r in results})
    return _finish(session, record, summary)


def format_latency_table(results: list[dict]) -> str:
    lines = [f"{'batch size':>10}  {'mean ms':>9}  {'p50 ms':>9}  {'p90 ms':>9}  {'p99 ms':>9}  {'samples/s':>12}"]
    for r in results:
        lines.append(
            f"{r['batch_size']:>10}  {r['mean_ms']:>9.3f}  {r['p50_ms']:>9.3f}  {r['p90_ms']:>9.3f}  {r['p99_ms']:>9.3f}  {r['samples_per_s']:>12,.0f}"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------- export


def run_export(config) -> dict:
    """Rank 0 verifies the checkpoint and writes the SavedModel; other ranks only wait for the outcome."""
    from tf_dlrm.calibration import Calibration
    from tf_dlrm.cli import builder, export

    env, spec, reporter, _ = start(config)
    outcome = None
    if env.is_chief:
        started = time.time()
        try:
            directory = checkpoint_store.latest_checkpoint(config.save_checkpoint_path) if config.resume else None
            directory = directory or checkpoint_store.resolve(config.restore_checkpoint_path)
            with checkpoint_lock.reading(directory):  # a training run's retention keeps it meanwhile
                manifest = checkpoint_store.read_manifest(directory)
                checkpoint_store.verify_files(directory, manifest)
                export.check_kind(directory, manifest, spec)  # before the spec comparison: the clearer error
                if manifest.get("model") is not None:  # saved by main.py (a script's checkpoint records no spec)
                    checkpoint_store.check_compatible(directory, manifest, spec, config.model,
                                                      builder.model_identity(config.model))
                info = export.export_checkpoint(directory, manifest, config.saved_model_path, spec, config.model,
                                                calibrated=config.calibration != "none")
            outcome = {"checkpoint": directory, "step": info["step"], "seconds": time.time() - started,
                       "calibrated": info["calibration"]}
        except (ValueError, TypeError, KeyError, OSError) as error:  # every rank raises it below
            outcome = {"error": str(error)}
    outcome = collectives.broadcast_json(env, outcome, "export_status")
    if "error" in outcome:
        raise checkpoint_store.CheckpointError(outcome["error"])
    record = {"mode": "export", "saved_model_path": config.saved_model_path, **outcome, "world_size": env.world_size}
    reporter.say(f"exported {outcome['checkpoint']} (step {outcome['step']}) to {config.saved_model_path}")
    calibrated = outcome["calibrated"]
    reporter.summary({"checkpoint": outcome["checkpoint"], "step": outcome["step"], "SavedModel": config.saved_model_path,
                      "calibration map": "none" if calibrated is None else
                      f"{Calibration.from_record(calibrated).describe()} (fitted on {calibrated.get('split', '?')})",
                      "export seconds": outcome["seconds"]})
    reporter.event("final", **record)
    reporter.close()
    return record


def _save_best_beside(keeper, checkpointer, step: int) -> None:
    """An interrupted run's best state, when only memory holds it: saved beside the last one (which
    ``latest`` keeps naming), so that the resumed run can end with it (collective)."""
    if not checkpointer.save_path or not keeper.in_memory or keeper.step == step:
        return
    best = checkpoint_store.checkpoint_name(keeper.step)
    on_disk = collectives.broadcast_json(checkpointer.env, checkpointer.env.is_chief and checkpoint_store.is_published(
        files.join(checkpointer.save_path, best)), "best_on_disk")
    if not on_disk:
        keeper.restore()  # the run ends here: the last state is saved already
        checkpointer.save(keeper.step, latest=False)


def _restore_best_from_disk(keeper, checkpointer, config, reporter) -> bool:
    """A resumed run whose best evaluation came before the resume: that state is read back from its
    checkpoint (kept against retention). False, with a line, when it is gone."""
    path = files.join(config.save_checkpoint_path, checkpoint_store.checkpoint_name(keeper.step)) \
        if config.save_checkpoint_path else None
    there = collectives.broadcast_json(checkpointer.env, bool(path) and checkpointer.env.is_chief
                                       and checkpoint_store.is_published(path), "best_checkpoint_there")
    if not there:
        reporter.say(f"keep_best: the best state (step {keeper.step}, {keeper.describe()}) came "
                     f"before the resume and its checkpoint is gone; the run ends with its last state")
        return False
    checkpointer.restore(path, for_training=True, own=True)
    reporter.say(f"keep_best: restored the state of step {keeper.step} ({keeper.describe()}) from {path}")
    return True
