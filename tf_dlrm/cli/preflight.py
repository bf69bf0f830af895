"""Checks a training run makes before its first step, so that no flag mistake costs a whole run.

Every rank runs them (they only look at the file system and the spec), so a refusal ends all ranks
the same way. What is checked:

- output paths: ``--save_checkpoint_path`` and ``--tensorboard_dir`` must be (or become) writable
  directories, ``--log_path`` a writable file; before issue #15 a file given as
  ``--save_checkpoint_path`` failed only after all training, losing the trained model;
- checkpoints outlive the process: ``ram://`` is refused for ``--save_checkpoint_path`` and
  ``--restore_checkpoint_path`` on the command line (a saved checkpoint vanished with its process);
- splits: ``--valid_split`` and ``--test_split`` are resolved against the dataset's splits
  (:mod:`tf_dlrm.cli.evaluation_splits`); a split named by hand must be one of the dataset's (a typo used
  to train without ever evaluating) and hold at least one sample; ``--valid_split=''`` (or ``none``, unless
  the spec has a split of that name) trains without evaluation; ``--early_stopping_patience`` needs a
  validation split, and no flag chooses by the test split without ``--select_on_test``.
"""

from __future__ import annotations

import dataclasses
import os

from tf_dlrm.cli import evaluation_splits
from tf_dlrm.io import files


def _nearest_existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def _check_writable_directory(flag: str, path: str | None) -> None:
    if not path:
        return
    if files.is_remote(path):
        _check_remote(flag, path)
        return
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"--{flag}={path} is a file; expected a directory (existing, or one to create)")
    existing = _nearest_existing(path)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--{flag}={path}: {existing} is not a writable directory, so nothing could be saved there")


def _check_remote(flag: str, path: str) -> None:
    """A remote output: its scheme must have a filesystem here, and it must not be a file (whether the
    store lets this run write there shows at the first write: object stores have no cheap check)."""
    try:
        if files.isfile(path):
            raise ValueError(f"--{flag}={path} is a file; expected a directory (existing, or one to create)")
    except OSError as error:
        raise ValueError(f"--{flag}={path}: {str(error).removeprefix(f'{path}: ')}") from None


def _check_writable_file(flag: str, path: str | None) -> None:
    if not path:
        return
    if files.is_remote(path):
        try:
            if files.isdir(path):
                raise ValueError(f"--{flag}={path} is a directory; expected a file name")
        except OSError as error:
            raise ValueError(f"--{flag}={path}: {str(error).removeprefix(f'{path}: ')}") from None
        return
    if os.path.isdir(path):
        raise ValueError(f"--{flag}={path} is a directory; expected a file name")
    if os.path.exists(path):
        if not os.access(path, os.W_OK):
            raise ValueError(f"--{flag}={path} exists and is not writable")
        return
    existing = _nearest_existing(os.path.dirname(os.path.abspath(path)))
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--{flag}={path}: {existing} is not a writable directory, so the file cannot be created")


def check_checkpoints_outlive_the_process(config) -> None:
    """Refuses checkpoint paths on a filesystem that ends with the process (``ram://``): a checkpoint
    saved there is gone before any later run could resume or restore from it.

    Checked where a command line starts a run (``main.py``); a user's own script may keep checkpoints
    in ``ram://`` for the length of its process."""
    for flag in ("save_checkpoint_path", "restore_checkpoint_path"):
        path = getattr(config, flag)
        if path and files.ends_with_process(path):
            raise ValueError(
                f"--{flag}={path} is in this process's memory and ends with the process: no later run (--resume, "
                f"--restore_checkpoint_path) could read a checkpoint from there. Expected a local directory or lasting "
                f"storage (gs://, s3://, hdfs://). Received: {flag}={path}")


def check_output_paths(config) -> None:
    """Raises ValueError naming the flag when an output of the run could not be written."""
    _check_writable_directory("save_checkpoint_path", config.save_checkpoint_path)
    _check_writable_directory("tensorboard_dir", config.tensorboard_dir)
    _check_writable_file("log_path", config.log_path)


def available_splits(config, spec) -> list[str]:
    """The dataset's splits: the spec's, or the record directories of NVIDIA's pre-batched TFRecords."""
    if config.dataset_type == "split_tfrecords":
        from tf_dlrm.data.split_tfrecords import splits_of

        return splits_of(spec)
    return list(spec.splits)


def check_splits(config, spec) -> evaluation_splits.EvaluationSplits:
    """The splits the run evaluates (:mod:`tf_dlrm.cli.evaluation_splits`), '' for one it does not; raises
    ValueError naming the flag on a split the dataset lacks, on ``--early_stopping_patience`` without a
    validation split, and on a choice by the test split that ``--select_on_test`` did not allow."""
    splits = available_splits(config, spec)
    resolved = evaluation_splits.resolve(config.valid_split, config.test_split, splits, config.select_on_test)
    if not resolved.valid and config.loop.early_stopping_patience:
        raise ValueError(f"--early_stopping_patience={config.loop.early_stopping_patience} counts evaluations of "
                         f"the validation split, and --valid_split='{config.valid_split}' names none (the dataset's "
                         f"splits: {splits}): give one")
    evaluation_splits.check_selection(resolved, splits, config.keep_best, config.loop.early_stopping_patience,
                                      config.loop.auc_threshold)
    valid = resolved.valid and _check_split(config, spec, "valid_split", resolved.valid,
                                            "or give --valid_split='' to train without evaluation")
    test = resolved.test and _check_split(config, spec, "test_split", resolved.test, "or leave --test_split out")
    return dataclasses.replace(resolved, valid=resolved.valid if valid else "", test=resolved.test if test else "")


def _check_split(config, spec, flag: str, split: str, otherwise: str) -> bool:
    if config.dataset_type == "synthetic":
        return split in spec.splits  # random in-memory batches: evaluated as before
    if config.dataset_type == "split_tfrecords":
        # Pre-batched TFRecords sit in <dataset>/<split>/, whatever the spec's source_spec says.
        directory = files.join(spec.base_directory, split)
        if not files.isdir(directory):
            raise ValueError(f"--{flag}={split}: no directory {directory} of pre-batched TFRecords; "
                             f"name an existing split, {otherwise}")
        return True
    if split not in spec.splits:
        raise ValueError(
            f"--{flag}={split} is not a split of {spec.source} (its splits: {spec.splits}); "
            f"name one of them, {otherwise}"
        )
    return True


def check_not_empty(split: str, reader, flag: str = "valid_split") -> None:
    """Raises ValueError when the evaluated split ``split`` (of ``--flag``) holds no sample."""
    if reader.num_samples == 0:
        raise ValueError(
            f"--{flag}={split}: the split holds no samples, so nothing can be evaluated on it; "
            f"give another split, or --{flag}='' to {'train without evaluation' if flag == 'valid_split' else 'skip it'}"
        )
