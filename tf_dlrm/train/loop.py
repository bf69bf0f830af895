"""The training loop: epochs of steps, periodic exact evaluation, early stop, logs and summary."""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from tf_dlrm.train.loop_config import LoopConfig
from tf_dlrm.data.reader import SplitBinaryReader
from tf_dlrm.metrics import exact_auc, logloss
from tf_dlrm.train.guards import LossWatch, check_scores
from tf_dlrm.train.reporting import Reporter
from tf_dlrm.train.step import Trainer


@dataclasses.dataclass
class EvalResult:
    auc: float
    logloss: float
    samples: int
    seconds: float


def evaluate(trainer: Trainer, reader: SplitBinaryReader, where: str = "evaluation") -> EvalResult:
    """Exact AUC and logloss over the whole split (padded last batch trimmed), same on every rank.

    Raises:
        NonFiniteError: when a score is NaN or inf (no AUC is computed from such scores).
    """
    started = time.time()
    # --hot_row_sync_every > 1: every rank's hot-row replicas merged first (collective; nothing without).
    _synchronize_hot_rows(trainer)
    predictions, labels = [], []
    for numerical, categorical, label in reader.dataset(epoch=0):
        probability, truth = trainer.predict_step(numerical, categorical, label)
        predictions.append(probability.numpy())
        labels.append(truth.numpy())
    predictions = np.concatenate(predictions)[: reader.num_samples]
    labels = np.concatenate(labels)[: reader.num_samples]
    check_scores(predictions, where)
    return EvalResult(exact_auc(labels, predictions), logloss(labels, predictions), len(labels), time.time() - started)


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
) -> TrainResult:
    """Runs the loop; ``on_step(step, epoch, batch_in_epoch)`` is called after each step (checkpoints),
    ``on_eval(step, result)`` after each evaluation (``--keep_best``)."""
    steps_per_epoch = train_reader.num_batches
    if steps_per_epoch == 0:
        raise ValueError(
            f"The training split has {train_reader.num_samples} samples, fewer than one global batch "
            f"of {train_reader.global_batch_size}: nothing to train on"
        )
    total_steps = int(math.ceil(config.epochs * steps_per_epoch))
    if config.max_steps >= 0:
        total_steps = min(total_steps, config.max_steps)
    eval_every = max(1, steps_per_epoch // config.evals_per_epoch) if config.evals_per_epoch else 0
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
        result = evaluate(trainer, valid_reader, where=f"evaluation at step {step}")
        evals.append(result)
        last_eval_step = step
        reporter.say(f"eval at step {step}: AUC {result.auc:.6f}  logloss {result.logloss:.6f}  ({result.samples} samples, {result.seconds:.1f} s)")
        reporter.event("eval", step=step, auc=result.auc, logloss=result.logloss, samples=result.samples)
        reporter.scalars(step, auc=result.auc, logloss=result.logloss)
        if on_eval is not None:
            on_eval(step, result)
        return result

    epoch = step // steps_per_epoch
    while step < total_steps and not stopped_early:
        start_batch = step - epoch * steps_per_epoch
        batches_left = min(steps_per_epoch - start_batch, total_steps - step)
        dataset = train_reader.dataset(epoch=epoch, start_batch=start_batch).take(batches_left)
        loss = None
        for batch_in_epoch, (numerical, categorical, label) in enumerate(dataset, start=start_batch):
            loss = trainer.train_step(numerical, categorical, label)
            losses.add(loss)
            step += 1
            window_steps += 1
            if on_step is not None:
                on_step(step, epoch, batch_in_epoch + 1)
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
        epoch += 1
    _synchronize_hot_rows(trainer)  # training ends with identical replicas on every rank
    if valid_reader is not None and last_eval_step != step:
        run_eval()
    throughput = timed_samples / timed_seconds if timed_seconds > 0 else float("nan")
    return TrainResult(step, throughput, evals[-1] if evals else None, evals, stopped_early)


def _synchronize_hot_rows(trainer) -> None:
    synchronize = getattr(trainer, "synchronize_hot_rows", None)
    if synchronize is not None:
        synchronize()


def _rates(trainer: Trainer, rate: float) -> str:
    """The learning rates in force, for a message: the schedule's, the embeddings' and the MLPs'."""
    config = trainer.config
    return (f"learning rate {rate:.6g}: embeddings ({config.embedding_optimizer}) {rate * config.embedding_rate_factor:.6g}, "
            f"MLPs ({config.optimizer}) {rate * config.dense_rate_factor:.6g}")
