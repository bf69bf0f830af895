"""A tf.data reader of split_binary datasets that reads whole batches and knows about ranks.

Rank ``r`` of ``N`` sees global batch ``b`` (samples ``[b*B, (b+1)*B)``) as:

- label and numerical features: its **local slice** ``[b*B + r*B/N, b*B + (r+1)*B/N)``;
- each categorical feature it asks for **globally**: all ``B`` ids of the global batch (the
  model-parallel tables it owns look up the whole batch before the alltoall);
- each categorical feature it asks for **locally**: its local slice (replicated tables, or the
  ``--data_parallel_input`` mode that exchanges ids with an alltoall).

A batch is one ``pread`` per file (contiguous bytes), never sample by sample; files on remote storage
(``gs://``, ``ram://``: :mod:`tf_dlrm.io.files`) are read the same way, one ranged read per file. Every rank builds the
same batch order from the same seed, so ranks agree on which global batch is current.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import tensorflow as tf

from tf_dlrm.data.ragged_split_binary import RaggedColumn, ragged_id_problem
from tf_dlrm.io.files import RandomAccessFile
from tf_dlrm.data.validation import CHANGED_ADVICE, BadDataError, id_problem, label_problem, numerical_problem, raw_label_dtype
from tf_dlrm.spec import dynamic as dynamic_spec
from tf_dlrm.spec.feature_spec import FeatureSpec
from tf_dlrm.spec.format import NUMERICAL_CHANNEL

LAST_BATCH_MODES = ("drop", "keep", "pad")

# Keys of dynamic tables are checked against no cardinality: every signed value read as unsigned is below 2**64.
DYNAMIC_KEY_BOUND = 1 << 64


@dataclasses.dataclass(frozen=True)
class _Column:
    path: str
    dtype: np.dtype
    width: int  # values per sample
    scope: str  # "global" or "local"
    out_dtype: np.dtype
    feature: str = ""
    cardinality: int = 0  # categorical only: ids must lie in [0, cardinality)
    ragged: object = None  # a variable-length feature's RaggedColumn (tf_dlrm.data.ragged_split_binary)


def read_columns(spec: FeatureSpec, input_modes: Mapping[str, str] | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(global columns, local columns)``: indices into the categorical channel of the features
    ``input_modes`` (``{name: "global" or "local"}``; None: every feature local) reads, in spec order.
    The numerical features (``"numerical"``) are always read for the local batch."""
    names = list(spec.categorical_features)
    if input_modes is None:
        return (), tuple(range(len(names)))
    unknown = sorted(set(input_modes) - set(names) - {NUMERICAL_CHANNEL})
    if unknown:
        raise ValueError(f"Expected inputs named like the spec's categorical features {names}. Received: {unknown}")
    bad = {name: mode for name, mode in input_modes.items() if mode not in ("global", "local")}
    if bad or input_modes.get(NUMERICAL_CHANNEL, "local") != "local":
        raise ValueError(f"Expected input modes 'global' or 'local' (the numerical features local). Received: "
                         f"{bad or {NUMERICAL_CHANNEL: input_modes[NUMERICAL_CHANNEL]}}")
    return (tuple(i for i, name in enumerate(names) if input_modes.get(name) == "global"),
            tuple(i for i, name in enumerate(names) if input_modes.get(name) == "local"))


class SplitBinaryReader:
    """Reads one split of a split_binary dataset as batches for one rank.

    Args:
        spec: a validated FeatureSpec.
        split: which ``source_spec`` split to read.
        global_batch_size: ``B``; must divide by ``world_size``.
        rank, world_size: this process's place among the data-parallel ranks.
        input_modes: ``{feature name: "global" or "local"}``, what the model reads on this rank
            (``model.input_modes``): a categorical feature's ids for the whole global batch or for the
            local slice; a feature not named is not read. Default: every categorical feature, local.
        last_batch: ``"drop"`` (training), ``"keep"`` (single process evaluation: a short last batch)
            or ``"pad"`` (distributed evaluation: the last global batch is padded with zeros to ``B``
            so every rank runs the same shapes; callers trim to :attr:`num_samples`).
        shuffle: shuffle the order of batches each epoch, from ``seed`` and the epoch number.
        seed: the shuffle seed, the same on every rank.
        parallel_reads: batches read concurrently.
        validate: refuse a batch holding an id outside ``[0, cardinality)``, a label other than 0
            or 1 (a ``bool`` file is read as bytes) or a non-finite numerical value
            (:class:`BadDataError` naming split, feature, file and sample); costs one reduction
            per column per batch. False only to measure that cost.

    Yields:
        ``(features, label float32 [b, 1])``: ``features`` maps ``"numerical"`` to float32 ``[b, n_num]``
        and each categorical feature read to its ids, ``int32`` (``int64`` when a cardinality exceeds
        int32) of shape ``[B]`` or ``[b]`` (``[B, hotness]`` or ``[b, hotness]`` for a multi-hot feature;
        a ``tf.RaggedTensor`` ``[B, None]`` or ``[b, None]`` for a variable-length one stored with a
        lengths file, :mod:`tf_dlrm.data.ragged_split_binary`).

    Raises:
        BadDataError: at construction, a variable-length feature's length outside ``[0, hotness]``
            or an ids file that does not hold the sum of its lengths.
    """

    def __init__(
        self,
        spec: FeatureSpec,
        split: str,
        global_batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        input_modes: Mapping[str, str] | None = None,
        last_batch: str = "drop",
        shuffle: bool = False,
        seed: int = 0,
        parallel_reads: int = 2,
        validate: bool = True,
    ):
        if global_batch_size <= 0:
            raise ValueError(f"Expected a positive global batch size. Received: global_batch_size={global_batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"Expected 0 <= rank < world_size. Received: rank={rank}, world_size={world_size}")
        if global_batch_size % world_size:
            raise ValueError(
                f"The global batch size must divide by the number of ranks. "
                f"Received: batch_size={global_batch_size}, world_size={world_size}"
            )
        if last_batch not in LAST_BATCH_MODES:
            raise ValueError(f"Expected last_batch in {LAST_BATCH_MODES}. Received: last_batch={last_batch!r}")
        self.files = spec.split_files(split)
        self.split, self.validate = split, validate
        self.numerical_features = list(spec.numerical_features)
        self.num_samples = self.files.num_samples
        self.global_batch_size = global_batch_size
        self.local_batch_size = global_batch_size // world_size
        self.rank, self.world_size = rank, world_size
        self.last_batch = last_batch
        self.shuffle, self.seed = shuffle, seed
        self.parallel_reads = parallel_reads
        self.global_categorical, self.local_categorical = read_columns(spec, input_modes)

        cardinalities = spec.cardinalities()
        self._label = _Column(self.files.label, raw_label_dtype(spec.dtype(spec.label_feature)), 1, "local",
                              np.dtype(np.float32), spec.label_feature)
        self._numerical = None
        if self.files.numerical:
            self._numerical = _Column(
                self.files.numerical, spec.numerical_dtype(), len(spec.numerical_features), "local", np.dtype(np.float32)
            )
        self._opened: dict[str, RandomAccessFile] = {}  # before the variable-length columns read their lengths
        self._categorical = []
        for scope, indices in (("global", self.global_categorical), ("local", self.local_categorical)):
            for index in indices:
                name = spec.categorical_features[index]
                out = np.int64 if cardinalities[index] > np.iinfo(np.int32).max else np.int32
                bound = cardinalities[index]
                if dynamic_spec.is_dynamic(spec.feature_spec[name]):
                    # Raw keys of a dynamic table: any value of the file's dtype is valid (no id bound).
                    out, bound = np.int64, DYNAMIC_KEY_BOUND
                lengths = self.files.lengths_of(index)
                ragged = None if lengths is None else RaggedColumn(
                    self.files.categorical[index], lengths, spec.dtype(name), spec.hotness(name), name, split,
                    self.num_samples, self.local_batch_size, open_file=self._file, weights_path=self.files.weights_of(index))
                self._categorical.append(
                    _Column(self.files.categorical[index], spec.dtype(name), spec.hotness(name), scope, np.dtype(out), name,
                            bound, ragged)
                )
        self.num_numerical = len(spec.numerical_features)

    # ------------------------------------------------------------------ sizes

    @property
    def num_batches(self) -> int:
        full, rest = divmod(self.num_samples, self.global_batch_size)
        return full + (1 if rest and self.last_batch != "drop" else 0)

    def batch_order(self, epoch: int) -> np.ndarray:
        order = np.arange(self.num_batches, dtype=np.int64)
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(order)
        return order

    # ------------------------------------------------------------------ reading

    def _file(self, path: str) -> RandomAccessFile:
        # One per file, shared by the reading threads (a local one preads: each read carries its offset).
        if path not in self._opened:
            self._opened[path] = RandomAccessFile(path)
        return self._opened[path]

    def _read_rows(self, column: _Column, start: int, count: int) -> np.ndarray:
        """Rows ``[start, start+count)`` of a column, zero-padded past the end of the split."""
        available = max(0, min(count, self.num_samples - start))
        record = column.dtype.itemsize * column.width
        raw = self._file(column.path).read(available * record, start * record)
        if len(raw) != available * record:
            raise BadDataError(
                f"{column.path}: read {len(raw)} of {available * record} bytes at offset {start * record} "
                f"(split '{self.split}'): the file changed under the running job, it now has "
                f"{self._file(column.path).size()} bytes and {self.num_samples * record} were expected"
            )
        if (change := self._file(column.path).changed()) is not None:  # overwritten in place: refused, not trained on
            raise BadDataError(f"{column.path}: {change} (split '{self.split}'): the file changed under the running job; "
                               f"{CHANGED_ADVICE}")
        values = np.frombuffer(raw, dtype=column.dtype).reshape(available, column.width)
        if available < count and self.last_batch == "pad":
            values = np.concatenate([values, np.zeros((count - available, column.width), column.dtype)])
        return values.astype(column.out_dtype)

    def _read_ragged(self, column: _Column, start: int, count: int) -> tuple[np.ndarray, ...]:
        """A variable-length feature's ``(ids, lengths)`` of rows ``[start, start+count)`` (a weighted one's
        ``(ids, lengths, weights)``); rows past the end of the split (``last_batch="pad"``) are empty."""
        ids, lengths = column.ragged.read(start, count)
        lengths = lengths.astype(np.int64)
        if lengths.size < count and self.last_batch == "pad":
            lengths = np.concatenate([lengths, np.zeros(count - lengths.size, np.int64)])
        if column.ragged.weights_path is None:
            return ids.astype(column.out_dtype), lengths
        return ids.astype(column.out_dtype), lengths, column.ragged.read_weights(start, count)

    def _spans(self, batch: int) -> dict[str, tuple[int, int]]:
        start = batch * self.global_batch_size
        global_count = self.global_batch_size
        local_start, local_count = start + self.rank * self.local_batch_size, self.local_batch_size
        if self.last_batch == "keep":
            # A short last batch, only meaningful with one rank: clip to the data.
            global_count = min(global_count, self.num_samples - start)
            local_count = max(0, min(local_count, self.num_samples - local_start))
        return {"global": (start, global_count), "local": (local_start, local_count)}

    def read_batch(self, batch: int) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
        """One batch as numpy arrays, in the layout the dataset yields."""
        spans = self._spans(int(batch))
        label = self._read_rows(self._label, *spans["local"])
        numerical = (
            self._read_rows(self._numerical, *spans["local"])
            if self._numerical
            else np.zeros((label.shape[0], 0), np.float32)
        )
        # One-hot features are [n]; multi-hot ones [n, hotness]; variable-length ones (ids, lengths).
        categorical = [self._read_ragged(c, *spans[c.scope]) if c.ragged else self._read_rows(c, *spans[c.scope])
                       for c in self._categorical]
        categorical = [ids.reshape(-1) if c.width == 1 and not c.ragged else ids
                       for ids, c in zip(categorical, self._categorical)]
        if self.validate:
            self._check(numerical, categorical, label, spans)
        return numerical, categorical, label

    def _check(self, numerical: np.ndarray, categorical: list[np.ndarray], label: np.ndarray, spans: dict) -> None:
        problem = label_problem(label, spans["local"][0])
        if problem:
            raise BadDataError(f"split '{self.split}', feature '{self._label.feature}', file {self._label.path}: {problem}")
        if self._numerical is not None:
            problem = numerical_problem(numerical, self.numerical_features, spans["local"][0])
            if problem:
                raise BadDataError(f"split '{self.split}', file {self._numerical.path}: {problem}")
        for column, ids in zip(self._categorical, categorical):
            problem = (ragged_id_problem(*ids[:2], column.cardinality, spans[column.scope][0]) if column.ragged
                       else id_problem(ids, column.cardinality, spans[column.scope][0]))
            if problem:
                raise BadDataError(f"split '{self.split}', feature '{column.feature}', file {column.path}: {problem}")

    def _read_flat(self, batch):
        numerical, categorical, label = self.read_batch(batch)
        flat = [part for ids, c in zip(categorical, self._categorical) for part in (ids if c.ragged else (ids,))]
        return (numerical, *flat, label)

    def dataset(self, epoch: int = 0, start_batch: int = 0) -> tf.data.Dataset:
        """The batches of one epoch, from position ``start_batch`` of that epoch's order."""
        order = self.batch_order(epoch)[start_batch:]
        # A variable-length feature travels as two tensors, its ids and its row lengths (a weighted one as three,
        # its weights last); the weights reach the model as ``<feature>_weights``, ragged like the ids.
        weighted = [c.ragged is not None and c.ragged.weights_path is not None for c in self._categorical]
        out_types = [tf.float32]
        for c, has_weights in zip(self._categorical, weighted):
            out_types += [tf.as_dtype(c.out_dtype), tf.int64] if c.ragged else [tf.as_dtype(c.out_dtype)]
            out_types += [tf.float32] if has_weights else []
        out_types.append(tf.float32)
        fixed = self.last_batch != "keep"
        local = self.local_batch_size if fixed else None
        shapes = [[local, self.num_numerical]]
        for column in self._categorical:
            rows = self.global_batch_size if fixed and column.scope == "global" else local
            if column.ragged:
                shapes += [[None], [rows]] + ([[None]] if column.ragged.weights_path is not None else [])
            else:
                shapes.append([rows] if column.width == 1 else [rows, column.width])
        shapes.append([local, 1])
        ragged = [c.ragged is not None for c in self._categorical]
        names = [c.feature for c in self._categorical]

        def read(batch):
            tensors = tf.numpy_function(self._read_flat, [batch], out_types, stateful=False)
            for tensor, shape in zip(tensors, shapes):
                tensor.set_shape(shape)
            categorical, weights, position = [], {}, 1
            for variable, has_weights, name in zip(ragged, weighted, names):
                if variable:
                    categorical.append(tf.RaggedTensor.from_row_lengths(tensors[position], tensors[position + 1],
                                                                        validate=False))
                    position += 2
                    if has_weights:
                        weights[f"{name}_weights"] = categorical[-1].with_values(tensors[position])
                        position += 1
                else:
                    categorical.append(tensors[position])
                    position += 1
            return {NUMERICAL_CHANNEL: tensors[0], **dict(zip(names, categorical)), **weights}, tensors[-1]

        options = tf.data.Options()
        options.deterministic = True
        dataset = tf.data.Dataset.from_tensor_slices(order).with_options(options)
        dataset = dataset.map(read, num_parallel_calls=self.parallel_reads, deterministic=True)
        return dataset.prefetch(tf.data.AUTOTUNE)

    def close(self) -> None:
        for opened in self._opened.values():
            opened.close()
        self._opened.clear()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing useful left to do
            pass
