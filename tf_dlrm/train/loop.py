"""The training loop: epochs of steps, periodic exact evaluation, early stopping, logs and summary."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time

import numpy as np
import tensorflow as tf

from tf_dlrm.parallel import collectives
from tf_dlrm.train.loop_config import LoopConfig
from tf_dlrm.data.reader import SplitBinaryReader
from tf_dlrm.calibration import Calibration, fit as fit_calibration
from tf_dlrm.metrics import ClickMetrics
from tf_dlrm.train.early_stopping import EarlyStopping, metric_name
from tf_dlrm.train.guards import LossWatch, check_score_count
from tf_dlrm.train.reporting import Reporter
from tf_dlrm.train.step import Trainer


@dataclasses.dataclass
class EvalResult:
    metrics: ClickMetrics  # with ``calibration`` applied, when there is one
    samples: int
    seconds: float
    batches: int = 0  # global batches evaluated
    partial: bool = False  # only the first --eval_max_batches batches of the split
    # The calibration applied (or fitted here and applied), None: none; then ``uncalibrated``: the model's own figures.
    calibration: Calibration | None = None
    uncalibrated: ClickMetrics | None = None
    calibration_note: str = ""  # why a calibration asked for was not fitted

    @property
    def auc(self) -> float:
        return self.metrics.auc

    @property
    def logloss(self) -> float:
        return self.metrics.logloss

    def record(self) -> dict:
        """The fields of a JSON log record: the metrics, the samples and whether the split was cut short; with a
        calibration, the uncalibrated figures as ``uncalibrated_logloss`` etc."""
        return {**self.metrics.as_dict(), **self.uncalibrated_fields(), "samples": self.samples, "partial": self.partial}

    def uncalibrated_fields(self, prefix: str = "") -> dict:
        """``{prefix}uncalibrated_logloss``, ``_ne`` and ``_calibration`` when a calibration was applied, else ``{}``
        (AUC is the same: a calibration never changes the ranking)."""
        if self.uncalibrated is None:
            return {}
        return {f"{prefix}uncalibrated_{name}": getattr(self.uncalibrated, name) for name in ("logloss", "ne", "calibration")}

    def describe(self) -> str:
        """The console's figures: the metrics, and with a calibration the uncalibrated ones after them."""
        line = self.metrics.describe()
        if self.uncalibrated is not None:
            u = self.uncalibrated
            line += f"  (uncalibrated: logloss {u.logloss:.6f}  NE {u.ne:.6f}  calibration {u.calibration:.4f})"
        return line


def evaluate(trainer: Trainer, reader: SplitBinaryReader, where: str = "evaluation", max_batches: int = 0,
             calibration: Calibration | None = None, fit: str | None = None) -> EvalResult:
    """Exact metrics (:class:`tf_dlrm.metrics.ClickMetrics`) over the split (padded last batch
    trimmed), or over its first ``max_batches`` global batches (0: all); the same on every rank.

    Each rank keeps the scores of its own rows; at the end they are gathered to rank 0 only, which
    puts them back in the split's order (the order every rank saw when each held all of them, so the
    figures are those of the whole split in one process), computes the metrics and broadcasts them.

    ``calibration``: applied to the logits (:mod:`tf_dlrm.calibration`); ``fit``: a method (``platt``,
    ``temperature``) fitted on these rows on rank 0, then applied (when the fit is refused, the result
    has no calibration and says why in ``calibration_note``). Either way ``metrics`` are the calibrated
    figures (the AUC the model's own: the map is increasing) and ``uncalibrated`` the model's.

    Raises:
        NonFiniteError: when a score is NaN or inf (no AUC is computed from such scores).
    """
    started = time.time()
    # --hot_row_sync_every > 1: every rank's hot-row replicas merged first (collective; nothing without).
    _synchronize_hot_rows(trainer)
    batches = reader.num_batches if max_batches <= 0 else min(max_batches, reader.num_batches)
    dataset = reader.dataset(epoch=0)
    if batches < reader.num_batches:
        dataset = dataset.take(batches)
    rows, sizes = [], []
    for features, label in dataset:
        local = trainer.predict_local(features, label).numpy()
        rows.append(local)
        sizes.append(local.shape[0])
    samples = min(batches * reader.global_batch_size, reader.num_samples)
    mine = np.concatenate(rows) if rows else np.zeros((0, 3), np.float32)
    values, outcome = _metrics_on_root(trainer.env, mine, np.asarray(sizes, np.int32), samples, calibration, fit)
    check_score_count(int(values[-2]), int(values[-1]), where)
    size = len(dataclasses.fields(ClickMetrics))
    metrics = ClickMetrics(*(float(v) for v in values[:size]))
    applied = Calibration.from_record(outcome.get("calibration"))
    uncalibrated = ClickMetrics(*(float(v) for v in values[size:2 * size])) if applied is not None else None
    return EvalResult(metrics, samples, time.time() - started, batches, batches < reader.num_batches, applied,
                      uncalibrated, outcome.get("note", ""))


def _metrics_on_root(env, mine: np.ndarray, sizes: np.ndarray, samples: int, calibration: Calibration | None = None,
                     fit: str | None = None) -> tuple[np.ndarray, dict]:
    """Rank 0 gathers every rank's ``(probability, label, logit)`` rows, restores the split's order, trims
    the padding and computes the metrics (with ``calibration``, or one it fits by ``fit``, applied); every rank
    gets them back as one float64 vector (the metrics, the uncalibrated ones, the count of non-finite scores
    and of scores) and ``{"calibration": record, "note": why none was fitted}``."""
    gathered, rows_per_rank = collectives.gather_to_root(env, tf.constant(mine), name="eval_scores")
    batch_sizes, _ = collectives.gather_to_root(env, tf.constant(sizes), name="eval_batch_sizes")
    size = len(dataclasses.fields(ClickMetrics))
    values = np.zeros(2 * size + 2, np.float64)
    outcome = {"calibration": None if calibration is None else calibration.record(), "note": ""}
    if env.is_chief:
        ordered = restore_split_order(gathered.numpy(), rows_per_rank.numpy(), batch_sizes.numpy(), env.world_size)[:samples]
        scores, labels, logits = ordered[:, 0], ordered[:, 1], ordered[:, 2]
        bad = int(np.count_nonzero(~np.isfinite(scores)))
        metrics = ClickMetrics.of(labels, scores) if not bad else ClickMetrics(*[math.nan] * size)
        calibrated = metrics
        if fit is not None and not bad:
            try:
                calibration = fit_calibration(logits, labels, fit)
            except ValueError as refusal:
                calibration, outcome["note"] = None, str(refusal)
            outcome["calibration"] = None if calibration is None else calibration.record()
        if calibration is not None and not bad:
            calibrated = calibrated_metrics(metrics, labels, calibration.probabilities(logits))
        values[:] = [*calibrated.as_dict().values(), *metrics.as_dict().values(), bad, scores.size]
    if env.distributed:
        values = collectives.broadcast(env, tf.constant(values), name="eval_metrics").numpy()
        if fit is not None:  # once a run: the fitted map (or why none) on every rank
            outcome = collectives.broadcast_json(env, outcome, "eval_calibration")
    return values, outcome


def calibrated_metrics(metrics: ClickMetrics, labels: np.ndarray, probabilities: np.ndarray) -> ClickMetrics:
    """The figures of calibrated ``probabilities``; the AUC is ``metrics``' (of the same logits): an increasing
    map keeps the ranking, and recomputing it could only add or remove float ties."""
    return ClickMetrics.of(labels, probabilities, auc=metrics.auc)


def restore_split_order(rows: np.ndarray, rows_per_rank: np.ndarray, batch_sizes: np.ndarray, world_size: int) -> np.ndarray:
    """Rows gathered rank after rank (each rank's batches in turn) put back batch after batch, each
    global batch being rank 0's local rows, then rank 1's, and so on."""
    if world_size == 1 or rows.shape[0] == 0:
        return rows
    sizes = batch_sizes.reshape(world_size, -1)  # [rank, batch]
    if (sizes == sizes[0, 0]).all():
        return rows.reshape(world_size, sizes.shape[1], sizes[0, 0], -1).transpose(1, 0, 2, 3).reshape(-1, rows.shape[1])
    blocks = np.split(rows, np.cumsum(rows_per_rank)[:-1])
    pieces = [np.split(block, np.cumsum(sizes[rank])[:-1]) for rank, block in enumerate(blocks)]
    return np.concatenate([pieces[rank][batch] for batch in range(sizes.shape[1]) for rank in range(world_size)])


@dataclasses.dataclass
class TrainResult:
    steps: int
    train_samples_per_s: float
    last_eval: EvalResult | None
    evals: list
    stopped_early: bool


def train(
    trainer: Trainer,
    train_reader: SplitBinaryReader,
    valid_reader: SplitBinaryReader | None,
    config: LoopConfig,
    reporter: Reporter,
    start_step: int = 0,
    on_step=None,
    on_eval=None,
    stopper: EarlyStopping | None = None,
    evaluation=None,
) -> TrainResult:
    """Runs the loop; ``on_step(step, epoch, batch_in_epoch)`` is called after each step (checkpoints),
    ``on_eval(step, result)`` after each evaluation (``--keep_best``). ``stopper``: the run's early
    stopping (a resumed run's carries its counts), else one made from ``config``. ``evaluation``: a
    context manager factory each evaluation runs inside (the stop watchdog's pause: an evaluation is
    no stuck step)."""
    steps_per_epoch = train_reader.num_batches
    if steps_per_epoch == 0:
        raise ValueError(
            f"The training split has {train_reader.num_samples} samples, fewer than one global batch "
            f"of {train_reader.global_batch_size}: nothing to train on"
        )
    total_steps = int(math.ceil(config.epochs * steps_per_epoch))
    if config.max_steps >= 0:
        total_steps = min(total_steps, config.max_steps)
    if config.eval_every_steps:
        eval_every = config.eval_every_steps
    else:
        eval_every = max(1, steps_per_epoch // config.evals_per_epoch) if config.evals_per_epoch else 0
    if stopper is None and config.early_stopping_patience:
        stopper = EarlyStopping(config.early_stopping_patience, config.early_stopping_min_delta, config.early_stopping_metric)
    if valid_reader is not None:
        _check_evaluation_schedule(config, eval_every, start_step, total_steps, stopper, reporter)
    global_batch = train_reader.global_batch_size

    evals: list[EvalResult] = []
    step = start_step
    timed_samples, timed_seconds = 0, 0.0
    window_start, window_steps = time.time(), 0
    stopped_early = False
    last_eval_step = -1
    losses = LossWatch(start_step)

    def run_eval():
        nonlocal last_eval_step
        with evaluation() if evaluation is not None else contextlib.nullcontext():
            result = evaluate(trainer, valid_reader, where=f"evaluation at step {step}", max_batches=config.eval_max_batches)
        evals.append(result)
        last_eval_step = step
        part = f", partial: the first {result.batches} of {valid_reader.num_batches} batches" if result.partial else ""
        reporter.say(f"eval at step {step}: {result.describe()}  ({result.samples} samples{part}, {result.seconds:.1f} s)")
        reporter.event("eval", step=step, **result.record())
        reporter.scalars(step, **result.metrics.as_dict())
        if on_eval is not None:
            on_eval(step, result)
        return result

    epoch = step // steps_per_epoch
    while step < total_steps and not stopped_early:
        start_batch = step - epoch * steps_per_epoch
        batches_left = min(steps_per_epoch - start_batch, total_steps - step)
        dataset = train_reader.dataset(epoch=epoch, start_batch=start_batch).take(batches_left)
        loss = None
        for batch_in_epoch, (features, label) in enumerate(dataset, start=start_batch):
            loss = trainer.train_step(features, label)
            losses.add(loss)
            step += 1
            window_steps += 1
            if step % config.print_freq == 0 or step == total_steps:
                rate = float(trainer.learning_rate.numpy())
                # The only host sync of the hot loop: this rank's losses are checked (finite), then
                # the printed loss is the global batch's, the mean over ranks.
                loss_value = trainer.mean_over_ranks(losses.read(_rates(trainer, rate)))
                now = time.time()
                # The first window includes tracing; throughput counts later windows when there are any.
                speed = window_steps * global_batch / max(now - window_start, 1e-9)
                if step > config.print_freq or step == total_steps:
                    timed_samples += window_steps * global_batch
                    timed_seconds += now - window_start
                reporter.progress(step, total_steps, loss_value, rate, speed)
                reporter.event("train", step=step, epoch=epoch, loss=loss_value, lr=rate, samples_per_s=speed)
                reporter.scalars(step, loss=loss_value, learning_rate=rate, samples_per_s=speed)
                window_start, window_steps = time.time(), 0
            if valid_reader is not None and eval_every and step % eval_every == 0 and step < total_steps:
                result = run_eval()
                window_start, window_steps = time.time(), 0
                if config.auc_threshold is not None and result.auc >= config.auc_threshold:
                    reporter.say(f"AUC {result.auc:.6f} reached the threshold {config.auc_threshold}: stopping")
                    stopped_early = True
                    break
                if stopper is not None and stopper.update(step, result):
                    name = metric_name(stopper.metric)
                    reporter.say(
                        f"early stopping: the validation {name} did not improve by more than {config.early_stopping_min_delta} "
                        f"in {stopper.patience} evaluations since step {stopper.best_step} ({name} {stopper.best:.6f}): stopping")
                    reporter.event("early_stop", step=step, best_step=stopper.best_step, metric=stopper.metric,
                                   **{f"best_{stopper.metric}": stopper.best}, patience=stopper.patience,
                                   min_delta=config.early_stopping_min_delta)
                    stopped_early = True
                    break
            # After the step's evaluation: a checkpoint of this step records the choice made on it.
            if on_step is not None:
                on_step(step, epoch, batch_in_epoch + 1)
        epoch += 1
    _synchronize_hot_rows(trainer)  # training ends with identical replicas on every rank
    if valid_reader is not None and last_eval_step != step:
        run_eval()
    throughput = timed_samples / timed_seconds if timed_seconds > 0 else float("nan")
    return TrainResult(step, throughput, evals[-1] if evals else None, evals, stopped_early)


def _check_evaluation_schedule(config: LoopConfig, eval_every: int, start_step: int, total_steps: int,
                               stopper: EarlyStopping | None, reporter: Reporter) -> None:
    """Says when the schedule evaluates only at the end; refuses early stopping that could never act.

    Evaluations during the run fall on the multiples of ``eval_every`` after ``start_step`` and before
    ``total_steps`` (the end has its own). Early stopping acts on one of them, after ``patience``
    evaluations without improvement (the first sets the best; a resumed run carries its counts)."""
    during = len(range(eval_every * (start_step // eval_every + 1), total_steps, eval_every)) if eval_every else 0
    if config.eval_every_steps:
        schedule = f"--eval_every_steps={config.eval_every_steps}"
    elif eval_every:
        schedule = f"--evals_per_epoch={config.evals_per_epoch} (every {eval_every} steps)"
    else:
        schedule = "--evals_per_epoch=0 (only at the end)"
    steps = f"{total_steps - start_step} steps" + (f" from step {start_step}" if start_step else "")
    if stopper is not None:
        needed = stopper.patience - stopper.waited + (1 if stopper.best is None else 0)
        if during < needed:
            raise ValueError(
                f"--early_stopping_patience={stopper.patience} can never stop this run: {schedule} evaluates {during} "
                f"time(s) before its last step ({steps}), and a stop needs {needed}. Expected evaluations often enough "
                f"for the patience to act (a smaller --eval_every_steps, or a longer run). Received: {schedule}, "
                f"--early_stopping_patience={stopper.patience}, {steps}")
    elif during == 0 and config.eval_every_steps:  # (--evals_per_epoch with a short --max_steps is the usual quick run)
        reporter.say(f"note: {schedule} is longer than the run ({steps}): the validation split is evaluated only "
                     "at the end")


def _synchronize_hot_rows(trainer) -> None:
    synchronize = getattr(trainer, "synchronize_hot_rows", None)
    if synchronize is not None:
        synchronize()


def _rates(trainer: Trainer, rate: float) -> str:
    """The learning rates in force, for a message: the schedule's, the embeddings' and the MLPs'."""
    config = trainer.config
    return (f"learning rate {rate:.6g}: embeddings ({config.embedding_optimizer}) {rate * trainer.embedding_rate_factor:.6g}, "
            f"MLPs ({config.optimizer}) {rate * config.dense_rate_factor:.6g}")
