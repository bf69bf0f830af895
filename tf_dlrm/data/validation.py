"""Checks of data values that no file size or dtype can catch: ids out of range, non-finite numericals.

Both the reader (on every batch it reads, for the features this rank reads) and the dataset scanner
(:mod:`tf_dlrm.data.check`, every sample of every file once) use these functions, so a problem gets
the same message whichever finds it. An id outside ``[0, cardinality)`` must never reach the
embedding: tables share one fused variable with row offsets, so id 5 of a 3-row table would read
and train the next table's rows without any error.

Labels must be 0 or 1 whatever their dtype: a ``bool`` label file is read as raw bytes
(:func:`raw_label_dtype`), since numpy reads any non-zero byte of a ``bool`` array as True and a
byte 2 or 255 would otherwise train as a positive without a word.

Cost per batch: one unsigned ``max`` per categorical column, one comparison over the labels and one
sum over the numerical block;
``benchmarks/check_overhead.py`` measures it, checked against unchecked in the same run.
"""

from __future__ import annotations

import re

import numpy as np

# tf.data wraps an exception raised in the reader's numpy_function into its own error text; the
# marker lets the command line recover this message alone (see :func:`message_of`).
MARKER = "BadDataError: "


# What a job whose data file was overwritten in place says after naming the file (the reader checks after every read).
CHANGED_ADVICE = ("no step trained on its new bytes. Put the data back as it was and continue with --resume, or train "
                  "on the new data with a new --save_checkpoint_path")


class BadDataError(ValueError):
    """A dataset value or file is wrong; the message names the split, feature, file and sample."""


def id_problem(ids: np.ndarray, cardinality: int, first_sample: int) -> str | None:
    """None when every id lies in ``[0, cardinality)``; else which sample holds the first bad one.

    Args:
        ids: ``[n]`` (one-hot) or ``[n, hotness]`` (multi-hot) ids of consecutive samples.
        cardinality: rows of the feature's table.
        first_sample: index in the split of ``ids[0]``.
    """
    if ids.size == 0:
        return None
    # The common case in one reduction: seen as unsigned, a negative id is larger than any cardinality.
    if ids.dtype.kind == "i" and int(ids.view(f"u{ids.dtype.itemsize}").max()) < cardinality:
        return None
    samples = ids.reshape(ids.shape[0], -1)
    outside = (samples < 0) | (samples >= cardinality)
    bad = np.flatnonzero(outside.any(axis=1))
    first = int(samples[bad[0]][outside[bad[0]]][0])
    return (
        f"sample {first_sample + int(bad[0])} has id {first} outside [0, {cardinality}) "
        f"({bad.size} such sample(s) among samples {first_sample}..{first_sample + samples.shape[0] - 1})"
    )


def raw_label_dtype(dtype) -> np.dtype:
    """The dtype to read a label file with: ``bool`` as ``uint8``, so bytes other than 0/1 stay visible."""
    dtype = np.dtype(dtype)
    return np.dtype(np.uint8) if dtype == np.bool_ else dtype


def label_problem(labels: np.ndarray, first_sample: int) -> str | None:
    """None when every label is 0 or 1; else which sample holds the first other value.

    Args:
        labels: ``[n]`` or ``[n, 1]`` labels of consecutive samples, read with :func:`raw_label_dtype`.
        first_sample: index in the split of ``labels[0]``.
    """
    labels = labels.reshape(-1)
    if labels.size == 0:
        return None
    bad = (labels != 0) & (labels != 1)
    if not bad.any():
        return None
    rows = np.flatnonzero(bad)
    value = labels[rows[0]].item()
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # the reader's float32 labels: a byte 2 reads as "2", not "2.0"
    return (
        f"sample {first_sample + int(rows[0])} has label {value}; expected 0 or 1 "
        f"({rows.size} such sample(s) among samples {first_sample}..{first_sample + labels.shape[0] - 1})"
    )


def numerical_problem(values: np.ndarray, names, first_sample: int) -> str | None:
    """None when every value is finite; else the first sample and feature holding a NaN or inf.

    Args:
        values: ``[n, len(names)]`` numerical features of consecutive samples.
        names: the numerical features' names, in column order.
        first_sample: index in the split of ``values[0]``.
    """
    if values.size == 0:
        return None
    # The common case in one vectorised sum (NaN and inf propagate); a finite sum that overflowed
    # is told apart by the full check below.
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(values.sum(dtype=np.float32)):
            return None
    if np.isfinite(values).all():
        return None
    rows, columns = np.nonzero(~np.isfinite(values))
    return (
        f"sample {first_sample + int(rows[0])}, feature '{names[columns[0]]}' is {values[rows[0], columns[0]]} "
        f"({rows.size} non-finite value(s) among samples {first_sample}..{first_sample + values.shape[0] - 1}); "
        "numerical features must be finite"
    )


def message_of(error: BaseException) -> str | None:
    """The BadDataError message inside a TensorFlow error raised through tf.data, or None."""
    if isinstance(error, BadDataError):
        return str(error)
    match = re.search(re.escape(MARKER) + r"(.*)", str(error))
    if not match:
        return None
    message = match.group(1).strip()
    # A tf.debugging.Assert inside tf.data prints its message and values as "[text] [value] [text]".
    message = re.sub(r"\] \[", " ", message).rstrip("]").strip()
    return message.replace("\\'", "'")
