"""The split_binary layout of a variable-length categorical feature: a lengths file beside its ids file.

A feature whose samples hold 0 to ``hotness`` ids (``ragged: true``) is stored, per split, as two
headerless files named by its split_binary chunk::

    {type: split_binary, features: [cat_3.bin], files: [train/cat_3.bin], lengths: train/cat_3.lengths.bin}

- ``lengths``: one integer per sample, the number of ids it holds, in the smallest of int8, int16,
  int32 that holds ``hotness`` (:func:`tf_dlrm.spec.format.lengths_dtype_for`); its size gives the
  split's sample count, like every other file of the split.
- ``files``: the ids of all samples back to back, in sample order, in the feature's dtype (the
  cardinality rule of fixed files); no padding, so it holds exactly ``sum(lengths)`` ids.

A weighted feature (``weighted: true``) has a third file, ``weights``: one float32 weight per id, in
the ids' order (``sum(lengths)`` of them), read at the ids' offsets::

    {type: split_binary, features: [cat_3.bin], files: [train/cat_3.bin], lengths: train/cat_3.lengths.bin,
     weights: train/cat_3.weights.bin}

Sample ``s`` holds ids ``[offset(s), offset(s) + lengths[s])`` with ``offset(s)`` the sum of the
lengths before it: offsets are a cumulative sum computed when a reader opens the file (one pass
over the lengths, which also refuses any length outside ``[0, hotness]`` naming the file, feature
and sample, and an ids file whose size is not the sum), kept only at the batch boundaries the reader
uses, so a batch is two ``pread`` calls: its lengths, then its ids.
"""

from __future__ import annotations

import numpy as np

from tf_dlrm.data.validation import CHANGED_ADVICE, BadDataError
from tf_dlrm.io.files import RandomAccessFile
from tf_dlrm.spec.format import lengths_dtype_for

# Lengths read per block by the offsets pass: bounds its memory whatever the split's size.
_SCAN_BLOCK = 1 << 22


class RaggedColumn:
    """Offsets and batch reads of one variable-length feature of one split.

    Args:
        ids_path, lengths_path: the feature's two files.
        ids_dtype: its ids' dtype (the spec's).
        hotness: the most ids a sample may hold.
        feature, split: named in errors.
        num_samples: the split's sample count (the lengths file holds exactly this many).
        granularity: reads start at multiples of this many samples (the reader's local batch size)
            or at ``num_samples``; offsets are kept at those points only.
        open_file: ``open_file(path) -> tf_dlrm.io.files.RandomAccessFile``, so that the caller's open
            files serve both files (default: the column opens each once itself).
        weights_path: a weighted feature's weights file (None: unweighted).

    Raises:
        BadDataError: a length outside ``[0, hotness]``, or an ids (weights) file that does not hold
            ``sum(lengths)`` ids (weights).
    """

    def __init__(self, ids_path: str, lengths_path: str, ids_dtype, hotness: int, feature: str, split: str,
                 num_samples: int, granularity: int, open_file=None, weights_path: str | None = None):
        self.ids_path, self.lengths_path, self.weights_path = ids_path, lengths_path, weights_path
        self._open_file = open_file or self._own_file
        self._own: dict[str, RandomAccessFile] = {}
        self.ids_dtype, self.lengths_dtype = np.dtype(ids_dtype), lengths_dtype_for(hotness)
        self.hotness, self.feature, self.split = hotness, feature, split
        self.num_samples, self.granularity = num_samples, granularity
        self.boundaries = self._scan()
        self.total = int(self.boundaries[-1])
        size = self._open_file(ids_path).size()
        if size != self.total * self.ids_dtype.itemsize:
            raise BadDataError(
                f"split '{split}', feature '{feature}', file {ids_path}: holds {size // self.ids_dtype.itemsize} ids "
                f"({size} bytes), but the lengths in {lengths_path} add up to {self.total}")
        if weights_path is not None:
            size = self._open_file(weights_path).size()
            if size != self.total * 4:
                raise BadDataError(
                    f"split '{split}', feature '{feature}', file {weights_path}: holds {size // 4} weights ({size} bytes), "
                    f"but the feature has {self.total} ids (the lengths in {lengths_path} add up to {self.total}): one "
                    f"float32 weight per id{self._first_short_row(size // 4)}")

    def _own_file(self, path: str) -> RandomAccessFile:
        if path not in self._own:
            self._own[path] = RandomAccessFile(path)
        return self._own[path]

    def read_at(self, path: str, size: int, offset: int) -> bytes:
        return self._open_file(path).read(size, offset)

    def _scan(self) -> np.ndarray:
        """Offsets at every multiple of ``granularity`` below ``num_samples``, then at ``num_samples``."""
        points = np.zeros(-(-self.num_samples // self.granularity) + 1, np.int64)
        running, step = 0, self.granularity * max(1, _SCAN_BLOCK // self.granularity)
        itemsize = self.lengths_dtype.itemsize
        for start in range(0, self.num_samples, step):
            count = min(step, self.num_samples - start)
            lengths = np.frombuffer(self.read_at(self.lengths_path, count * itemsize, start * itemsize), self.lengths_dtype)
            if lengths.size != count:
                raise BadDataError(f"split '{self.split}', feature '{self.feature}', file {self.lengths_path}: short read "
                                   f"at sample {start}: the file changed while it was read")
            self.check_lengths(lengths, start)
            sums = np.cumsum(lengths, dtype=np.int64)
            # Offsets of the boundaries inside this block: the running total before each.
            first = start // self.granularity
            inside = np.arange(0, count, self.granularity)
            points[first:first + inside.size] = running + np.concatenate([[0], sums])[inside]
            running += int(sums[-1]) if count else 0
        points[-1] = running
        return points

    def check_lengths(self, lengths: np.ndarray, first_sample: int) -> None:
        bad = np.flatnonzero((lengths < 0) | (lengths > self.hotness))
        if bad.size:
            raise BadDataError(
                f"split '{self.split}', feature '{self.feature}', file {self.lengths_path}: sample "
                f"{first_sample + int(bad[0])} holds {int(lengths[bad[0]])} ids, more than its hotness {self.hotness}"
                if lengths[bad[0]] > 0 else
                f"split '{self.split}', feature '{self.feature}', file {self.lengths_path}: sample "
                f"{first_sample + int(bad[0])} has the negative length {int(lengths[bad[0]])}")

    def _first_short_row(self, weights: int) -> str:
        """Where the weights run out: the first sample whose ids have no weight (one pass over the lengths)."""
        if weights >= self.total:
            return ""
        itemsize = self.lengths_dtype.itemsize
        running = 0
        for start in range(0, self.num_samples, _SCAN_BLOCK):
            count = min(_SCAN_BLOCK, self.num_samples - start)
            ends = running + np.cumsum(np.frombuffer(self.read_at(self.lengths_path, count * itemsize, start * itemsize),
                                                     self.lengths_dtype), dtype=np.int64)
            if ends.size and ends[-1] > weights:
                return f"; sample {start + int(np.searchsorted(ends, weights, side='right'))} is the first without its weights"
            running = int(ends[-1]) if ends.size else running
        return ""

    def read_weights(self, start: int, count: int) -> np.ndarray:
        """The float32 weights of samples ``[start, start + count)`` clipped to the split (one read)."""
        available = max(0, min(count, self.num_samples - start))
        begin, end = (self.offset(start), self.offset(start + available)) if available else (0, 0)
        raw = self.read_at(self.weights_path, (end - begin) * 4, begin * 4)
        if len(raw) != (end - begin) * 4 or (change := self._open_file(self.weights_path).changed()) is not None:
            raise BadDataError(f"split '{self.split}', feature '{self.feature}', file {self.weights_path}: short read or "
                               f"a change at sample {start}: the file changed under the running job; {CHANGED_ADVICE}")
        return np.frombuffer(raw, np.float32)

    def offset(self, sample: int) -> int:
        """Ids before ``sample`` (a multiple of ``granularity``, or ``num_samples``)."""
        if sample >= self.num_samples:
            return self.total
        index, rest = divmod(sample, self.granularity)
        if rest:
            raise ValueError(f"Expected a read at a multiple of {self.granularity} samples. Received: {sample}")
        return int(self.boundaries[index])

    def read(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, lengths)`` of samples ``[start, start + count)`` clipped to the split (two reads)."""
        available = max(0, min(count, self.num_samples - start))
        itemsize = self.lengths_dtype.itemsize
        lengths = np.frombuffer(self.read_at(self.lengths_path, available * itemsize, start * itemsize), self.lengths_dtype)
        begin, end = (self.offset(start), self.offset(start + available)) if available else (0, 0)
        raw = self.read_at(self.ids_path, (end - begin) * self.ids_dtype.itemsize, begin * self.ids_dtype.itemsize)
        if lengths.size != available or len(raw) != (end - begin) * self.ids_dtype.itemsize:
            raise BadDataError(f"split '{self.split}', feature '{self.feature}': short read of {self.ids_path} or "
                               f"{self.lengths_path} at sample {start}: the files changed under the running job")
        for path in (self.lengths_path, self.ids_path):
            if (change := self._open_file(path).changed()) is not None:
                raise BadDataError(f"split '{self.split}', feature '{self.feature}', file {path}: {change}: the file "
                                   f"changed under the running job; {CHANGED_ADVICE}")
        return np.frombuffer(raw, self.ids_dtype), lengths


def ragged_id_problem(ids: np.ndarray, lengths: np.ndarray, cardinality: int, first_sample: int) -> str | None:
    """None when every id lies in ``[0, cardinality)``; else which sample holds the first bad one."""
    if ids.size == 0:
        return None
    if ids.dtype.kind == "i" and int(ids.view(f"u{ids.dtype.itemsize}").max()) < cardinality:
        return None
    outside = (ids < 0) | (ids >= cardinality)
    first = int(np.flatnonzero(outside)[0])
    sample = int(np.searchsorted(np.cumsum(lengths, dtype=np.int64), first, side="right"))
    return (f"sample {first_sample + sample} has id {int(ids[first])} outside [0, {cardinality}) "
            f"({int(outside.sum())} such id(s) among samples {first_sample}..{first_sample + lengths.size - 1})")


def flatten_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, lengths)`` of ``[n, hotness]`` rows that end in -1 past their length (as the synthetic
    generator draws them), or of a ``(ids, lengths)`` pair given as is."""
    if isinstance(rows, tuple):
        ids, lengths = rows
        return np.asarray(ids).reshape(-1), np.asarray(lengths).reshape(-1)
    rows = np.asarray(rows)
    present = rows >= 0
    return rows[present], present.sum(axis=1)
