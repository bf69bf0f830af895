"""The vocabulary of the feature-spec format (:mod:`tf_dlrm.spec.feature_spec`): names and allowed values.

Channel, chunk-type and split names, the dtypes and combiners a feature may have, the error every
check raises, and the rule that picks a categorical feature's id dtype. A module of its own because
the spec class and its structural and data-file checks (:mod:`tf_dlrm.spec.validation`)
all use them; :mod:`tf_dlrm.spec.feature_spec` re-exports
every name, so callers import them from there.
"""

from __future__ import annotations

import numpy as np

LABEL_CHANNEL = "label"
NUMERICAL_CHANNEL = "numerical"
CATEGORICAL_CHANNEL = "categorical"
CHANNELS = (LABEL_CHANNEL, NUMERICAL_CHANNEL, CATEGORICAL_CHANNEL)

SPLIT_BINARY = "split_binary"
CSV = "csv"
PARQUET = "parquet"
CHUNK_TYPES = (SPLIT_BINARY, CSV, PARQUET)
# Optional chunk keys; `header` and `delimiter` only mean something for csv chunks, `encode` (raw
# categorical values -> keys) and `transform` for csv and parquet chunks (see tf_dlrm.data.transcode).
# `lengths` marks a split_binary chunk of a variable-length categorical feature: the file of its row
# lengths beside `files` (its ids), see tf_dlrm.data.ragged_split_binary; `weights`, beside `lengths`, the file of a
# weighted feature's float32 weights, one per id.
CHUNK_KEYS = ("type", "features", "files", "lengths", "weights", "header", "delimiter", "encode", "transform")

# The keys a feature entry may hold besides a dynamic table's (tf_dlrm.spec.dynamic.KEYS). NVIDIA's
# DLRM_and_DCNv2 specs hold dtype, cardinality, hotness (the most ids a sample holds) and alpha (the
# power-law exponent of their synthetic generator, unused here); tf_dlrm adds embedding_dim and
# combiner and ragged (a sample holds 0 to hotness ids) and weighted (a weight per id, in a weights file),
# and transcode records how it encoded a feature (encoded, vocabulary, oov_id, transform).
FEATURE_KEYS = ("dtype", "cardinality", "hotness", "alpha", "embedding_dim", "combiner", "ragged", "weighted",
                "encoded", "vocabulary", "oov_id", "transform")

COMBINERS = ("sum", "mean", "sqrtn")
SUPPORTED_DTYPES = ("bool", "float16", "float32", "int8", "int16", "int32", "int64")
INTEGER_DTYPES = ("int8", "int16", "int32", "int64")
FLOAT_DTYPES = ("float16", "float32")

TRAIN_SPLIT = "train"
TEST_SPLIT = "test"


class FeatureSpecError(ValueError):
    """A feature spec, or the data files it names, is not valid."""


def categorical_dtype_for(cardinality: int) -> np.dtype:
    """The smallest signed integer type NVIDIA's DLRM uses for ids of this cardinality.

    Their rule is ``cardinality < iinfo(t).max`` over int8, int16, int32; we extend it with int64 so
    that tables beyond 2**31 rows are representable.
    """
    for candidate in (np.int8, np.int16, np.int32):
        if cardinality < np.iinfo(candidate).max:
            return np.dtype(candidate)
    return np.dtype(np.int64)


def lengths_dtype_for(hotness: int) -> np.dtype:
    """The dtype of a variable-length feature's lengths file: the smallest of int8, int16, int32 that
    holds ``hotness`` (the longest row)."""
    for candidate in (np.int8, np.int16, np.int32):
        if hotness <= np.iinfo(candidate).max:
            return np.dtype(candidate)
    raise FeatureSpecError(f"Expected a hotness below 2**31. Received: {hotness}")
