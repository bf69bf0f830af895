"""Writer of split_binary files (NVIDIA's TF2 DLRM layout) for one split of a FeatureSpec.

Data is appended in blocks of samples and published atomically: every file is written as
``<name>.partial`` and renamed into place only by :meth:`SplitBinaryWriter.close`, so an interrupted
or failed write never leaves a truncated file where a dataset used to be.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from tf_dlrm.spec.feature_spec import FeatureSpec
from tf_dlrm.data.ragged_split_binary import flatten_rows
from tf_dlrm.spec.format import SPLIT_BINARY, lengths_dtype_for


class SplitBinaryWriter:
    """Appends blocks of samples to one split's split_binary files.

    Args:
        spec: the spec whose ``source_spec[split]`` names the files (paths relative to
            ``spec.base_directory``) and whose ``feature_spec`` gives the dtypes.
        split: the split to write, e.g. ``"train"``.

    Use as a context manager; leaving the block with an exception discards the partial files.
    """

    def __init__(self, spec: FeatureSpec, split: str):
        chunks = spec.chunks(split)
        if any(chunk["type"] != SPLIT_BINARY for chunk in chunks):
            raise ValueError(f"Split '{split}' of {spec.source} is not split_binary; cannot write it")
        self._spec = spec
        self._split = split
        by_feature = {f: spec.resolve(chunk["files"][0]) for chunk in chunks for f in chunk["features"]}
        # Variable-length features (a `lengths` file, tf_dlrm.data.ragged_split_binary): feature -> lengths path.
        self._lengths_paths = {chunk["features"][0]: spec.resolve(chunk["lengths"]) for chunk in chunks if chunk.get("lengths")}
        # Weighted features (a `weights` file beside the lengths file): feature -> weights path.
        self._weights_paths = {chunk["features"][0]: spec.resolve(chunk["weights"]) for chunk in chunks if chunk.get("weights")}
        self._label_path = by_feature[spec.label_feature]
        self._numerical_path = by_feature[spec.numerical_features[0]] if spec.numerical_features else None
        self._categorical_paths = [by_feature[name] for name in spec.categorical_features]
        self._label_dtype = spec.dtype(spec.label_feature)
        self._numerical_dtype = spec.numerical_dtype()
        self._categorical_dtypes = [spec.dtype(name) for name in spec.categorical_features]
        # Raw keys of dynamic tables (tf_dlrm.embedding.dynamic) have no id bound: any value of the dtype.
        self._cardinalities = [None if spec.feature_spec[name].get("dynamic") is True else rows
                               for name, rows in zip(spec.categorical_features, spec.cardinalities())]
        self._streams = {}
        for path in self.paths:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self._streams[path] = open(path + ".partial", "wb")
        self.num_samples = 0
        self._closed = False

    @property
    def paths(self) -> list[str]:
        paths = [self._label_path] + self._categorical_paths + list(self._lengths_paths.values()) + list(self._weights_paths.values())
        if self._numerical_path:
            paths.insert(1, self._numerical_path)
        return paths

    def append(self, label: np.ndarray, numerical: np.ndarray | None, categorical: Sequence[np.ndarray]) -> None:
        """Appends ``n`` samples.

        Args:
            label: ``[n]`` or ``[n, 1]`` of 0/1 values.
            numerical: ``[n, num_numerical]`` floats (None when the spec has no numerical features).
            categorical: one ``[n]`` integer array per categorical feature, ids in ``[0, cardinality)``
                (``[n, hotness]`` for a multi-hot feature: exactly ``hotness`` ids per sample); for a
                variable-length feature (a ``lengths`` file) ``[n, hotness]`` rows ending in -1 past
                their length, or a pair ``(ids, lengths)``; for a weighted one, ``(ids, lengths, weights)``
                with one weight per id.

        Raises:
            ValueError: on wrong shapes or out-of-range ids (naming the feature).
        """
        label = np.asarray(label).reshape(-1)
        count = label.shape[0]
        self._streams[self._label_path].write(label.astype(self._label_dtype).tobytes())
        if self._numerical_path:
            numerical = np.asarray(numerical)
            expected = (count, len(self._spec.numerical_features))
            if numerical.shape != expected:
                raise ValueError(f"numerical block: expected shape {expected}. Received: {numerical.shape}")
            self._streams[self._numerical_path].write(np.ascontiguousarray(numerical, dtype=self._numerical_dtype).tobytes())
        if len(categorical) != len(self._categorical_paths):
            raise ValueError(
                f"expected {len(self._categorical_paths)} categorical arrays. Received: {len(categorical)}"
            )
        for name, ids, path, dtype, cardinality in zip(
            self._spec.categorical_features, categorical, self._categorical_paths, self._categorical_dtypes, self._cardinalities
        ):
            hotness = self._spec.hotness(name)
            if name in self._weights_paths:
                if not isinstance(ids, tuple) or len(ids) != 3:
                    raise ValueError(f"feature '{name}' is weighted: expected (ids, lengths, weights). Received: {type(ids).__name__}")
                ids, lengths, weights = (np.asarray(a).reshape(-1) for a in ids)
                if weights.size != ids.size:
                    raise ValueError(f"feature '{name}': expected one weight per id ({ids.size}). Received: {weights.size} weights")
                self._streams[self._weights_paths[name]].write(weights.astype(np.float32).tobytes())
                ids = (ids, lengths)
            if name in self._lengths_paths:
                ids, lengths = flatten_rows(ids)
                if lengths.shape != (count,) or lengths.min(initial=0) < 0 or lengths.max(initial=0) > hotness \
                        or ids.size != int(lengths.sum()):
                    raise ValueError(f"feature '{name}': expected {count} rows of 0 to {hotness} ids. Received: "
                                     f"{lengths.size} lengths in [{lengths.min(initial=0)}, {lengths.max(initial=0)}] "
                                     f"for {ids.size} ids")
                self._streams[self._lengths_paths[name]].write(lengths.astype(lengths_dtype_for(hotness)).tobytes())
                hotness = None
            ids = np.asarray(ids)
            if hotness is not None and (ids.size != count * hotness or (hotness > 1 and ids.shape != (count, hotness))):
                raise ValueError(f"feature '{name}': expected {count * hotness} ids ({count} samples of hotness {hotness}). "
                                 f"Received: shape {ids.shape}")
            ids = ids.reshape(-1)
            if ids.size and cardinality is not None and (ids.min() < 0 or ids.max() >= cardinality):
                raise ValueError(
                    f"feature '{name}': ids must lie in [0, {cardinality}). Received range [{ids.min()}, {ids.max()}]"
                )
            self._streams[path].write(ids.astype(dtype).tobytes())
        self.num_samples += count

    def close(self) -> int:
        """Flushes and publishes all files; returns the number of samples written."""
        if self._closed:
            return self.num_samples
        for path, stream in self._streams.items():
            stream.flush()
            os.fsync(stream.fileno())
            stream.close()
        for path in self._streams:
            os.replace(path + ".partial", path)
        self._closed = True
        return self.num_samples

    def abort(self) -> None:
        """Discards the partial files; files already published before this writer are untouched."""
        for path, stream in self._streams.items():
            stream.close()
            if os.path.exists(path + ".partial"):
                os.unlink(path + ".partial")
        self._closed = True

    def __enter__(self) -> "SplitBinaryWriter":
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
