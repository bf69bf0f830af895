"""Checks a training run makes before its first step, so that no flag mistake costs a whole run.

Every rank runs them (they only look at the file system and the spec), so a refusal ends all ranks
the same way. What is checked:

- output paths: ``--save_checkpoint_path`` and ``--tensorboard_dir`` must be (or become) writable
  directories, ``--log_path`` a writable file; before issue #15 a file given as
  ``--save_checkpoint_path`` failed only after all training, losing the trained model;
- splits: ``--valid_split`` must name a split of the spec (a typo used to train without ever
  evaluating) and hold at least one sample; ``--valid_split=''`` (or ``none``, unless the spec has a
  split of that name) trains without evaluation.
"""

from __future__ import annotations

import os


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
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"--{flag}={path} is a file; expected a directory (existing, or one to create)")
    existing = _nearest_existing(path)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--{flag}={path}: {existing} is not a writable directory, so nothing could be saved there")


def _check_writable_file(flag: str, path: str | None) -> None:
    if not path:
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


def check_output_paths(config) -> None:
    """Raises ValueError naming the flag when an output of the run could not be written."""
    _check_writable_directory("save_checkpoint_path", config.save_checkpoint_path)
    _check_writable_directory("tensorboard_dir", config.tensorboard_dir)
    _check_writable_file("log_path", config.log_path)


def check_valid_split(config, spec) -> bool:
    """Whether to evaluate; raises ValueError on a ``--valid_split`` that the spec does not have."""
    if not config.valid_split or (config.valid_split == "none" and "none" not in spec.splits):
        return False
    if config.dataset_type == "synthetic":
        return config.valid_split in spec.splits  # random in-memory batches: evaluated as before
    if config.dataset_type == "split_tfrecords":
        # Pre-batched TFRecords sit in <dataset>/<split>/, whatever the spec's source_spec says.
        directory = os.path.join(spec.base_directory, config.valid_split)
        if not os.path.isdir(directory):
            raise ValueError(f"--valid_split={config.valid_split}: no directory {directory} of pre-batched TFRecords; "
                             "name an existing split, or give --valid_split='' to train without evaluation")
        return True
    if config.valid_split not in spec.splits:
        raise ValueError(
            f"--valid_split={config.valid_split} is not a split of {spec.source} (its splits: {spec.splits}); "
            "name one of them, or give --valid_split='' to train without evaluation"
        )
    return True


def check_not_empty(split: str, reader) -> None:
    """Raises ValueError when the validation split ``split`` holds no sample."""
    if reader.num_samples == 0:
        raise ValueError(
            f"--valid_split={split}: the split holds no samples, so nothing can be evaluated on it; "
            "give another split, or --valid_split='' to train without evaluation"
        )
