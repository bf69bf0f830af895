"""Frequency counts of categorical values and the vocabularies that map them to ids.

Id assignment, per categorical feature (the contract both engines follow byte for byte):

- id 0: missing (empty field);
- id 1: rare or unseen: a value counted fewer than ``frequency_threshold`` times in the training
  split, or never seen there (e.g. only in the test split, or in a later day);
- ids 2, 3, ...: the values counted at least ``frequency_threshold`` times, by descending count,
  ties broken by the 32-bit hash value ascending;
- cardinality = 2 + number of kept values.

Counts are kept as one sorted table of ``key = feature << 32 | hash`` with an int64 count, merged
with sorts (no Python loop over values): memory grows with the number of distinct values, never
with the number of rows.

A vocabulary is saved as ``manifest.json`` plus one ``cat_<i>.npy`` per feature: an int64 array
``[kept, 2]`` of ``(hash, training count)`` rows in id order (row ``j`` has id ``j + 2``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Iterable, Sequence

import numpy as np

MISSING_ID = 0
RARE_ID = 1
FIRST_VALUE_ID = 2
FORMAT = "tf_dlrm.criteo_vocabulary"
FORMAT_VERSION = 1
_VALUE_BITS = 32
_VALUE_MASK = np.int64((1 << _VALUE_BITS) - 1)


class VocabularyError(ValueError):
    """A saved vocabulary cannot be used."""


@dataclasses.dataclass(frozen=True, eq=False)
class CountTable:
    """Sorted unique ``feature << 32 | hash`` keys and how often each was seen."""

    keys: np.ndarray  # int64, ascending, unique
    counts: np.ndarray  # int64

    @staticmethod
    def empty() -> "CountTable":
        return CountTable(np.zeros(0, np.int64), np.zeros(0, np.int64))

    @staticmethod
    def from_values(categorical: np.ndarray) -> "CountTable":
        """Counts a ``[rows, features]`` block of hash values; missing (negative) values are skipped."""
        return _count(keys_of(categorical))

    @staticmethod
    def merge(tables: Sequence["CountTable"]) -> "CountTable":
        tables = [table for table in tables if table.keys.size]
        if len(tables) <= 1:
            return tables[0] if tables else CountTable.empty()
        keys = np.concatenate([t.keys for t in tables])
        order = np.argsort(keys)  # the default sort is vectorised (AVX-512 where available); stability is not needed
        keys = keys[order]
        starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
        return CountTable(keys[starts], np.add.reduceat(np.concatenate([t.counts for t in tables])[order], starts))

    def kept(self, frequency_threshold: int) -> "CountTable":
        """Only the keys counted at least ``frequency_threshold`` times."""
        keep = self.counts >= frequency_threshold
        return CountTable(self.keys[keep], self.counts[keep])

    def bucket(self, index: int, num_buckets: int) -> "CountTable":
        """The keys with ``key % num_buckets == index`` (to spread a reduction over workers)."""
        chosen = self.keys % num_buckets == index
        return CountTable(self.keys[chosen], self.counts[chosen])


def keys_of(categorical: np.ndarray) -> np.ndarray:
    """``feature << 32 | hash`` of every present value of a ``[rows, features]`` block."""
    features = np.arange(categorical.shape[1], dtype=np.int64) << _VALUE_BITS
    return (categorical + features)[categorical >= 0]


def _count(keys: np.ndarray) -> CountTable:
    """Unique keys (ascending) and how often each occurs."""
    if keys.size == 0:
        return CountTable.empty()
    keys = np.sort(keys)
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
    return CountTable(keys[starts], np.diff(np.append(starts, keys.size)).astype(np.int64))


class CountAccumulator:
    """Counts blocks of values with bounded work.

    Raw keys of many blocks wait in a pending list until they are as many as the distinct keys
    counted so far (and at least ``min_pending``); then they are counted with one plain sort and
    merged into the table with one more. Every key is sorted a small constant number of times, and
    memory stays within a few times the distinct keys (plus ``min_pending`` keys).
    """

    def __init__(self, min_pending: int = 4 << 20):
        self._merged = CountTable.empty()
        self._pending: list[np.ndarray] = []
        self._tables: list[CountTable] = []
        self._pending_keys = 0
        self._min_pending = min_pending

    def add_values(self, categorical: np.ndarray) -> None:
        """Counts a ``[rows, features]`` block of hash values (negative = missing)."""
        self._add(keys_of(categorical), None)

    def add(self, table: CountTable) -> None:
        self._add(None, table)

    def _add(self, keys: np.ndarray | None, table: CountTable | None) -> None:
        if keys is not None:
            self._pending.append(keys)
            self._pending_keys += keys.size
        else:
            self._tables.append(table)
            self._pending_keys += table.keys.size
        if self._pending_keys >= max(self._min_pending, self._merged.keys.size):
            self._flush()

    def _flush(self) -> None:
        raw = [_count(np.concatenate(self._pending))] if self._pending else []
        self._merged = CountTable.merge([self._merged] + self._tables + raw)
        self._pending, self._tables, self._pending_keys = [], [], 0

    def result(self) -> CountTable:
        self._flush()
        return self._merged


@dataclasses.dataclass(frozen=True, eq=False)
class Vocabulary:
    """Per categorical feature: the kept hash values in id order and their training counts."""

    frequency_threshold: int
    values: tuple[np.ndarray, ...]  # int64 hashes, row j has id j + 2
    counts: tuple[np.ndarray, ...]

    def __post_init__(self):
        object.__setattr__(self, "_tables", None)

    def __getstate__(self):
        # The lookup tables are rebuilt where they are used (e.g. on Spark executors), not shipped.
        return {key: value for key, value in self.__dict__.items() if key != "_tables"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        object.__setattr__(self, "_tables", None)

    def prepare(self) -> "Vocabulary":
        """Builds the hash tables :meth:`lookup` uses (done on first use; call before forking workers)."""
        if self._tables is None:
            object.__setattr__(self, "_tables", [_HashTable.build(values) for values in self.values])
        return self

    @staticmethod
    def from_counts(table: CountTable, num_features: int, frequency_threshold: int) -> "Vocabulary":
        """Builds the vocabulary from training counts (see the module docstring for the id rule)."""
        kept = table.kept(frequency_threshold)
        feature = kept.keys >> _VALUE_BITS
        bounds = np.searchsorted(feature, np.arange(num_features + 1))
        values, counts = [], []
        for index in range(num_features):
            hashes = kept.keys[bounds[index] : bounds[index + 1]] & _VALUE_MASK
            seen = kept.counts[bounds[index] : bounds[index + 1]]
            order = np.lexsort((hashes, -seen))  # count descending, then hash ascending
            values.append(hashes[order])
            counts.append(seen[order])
        return Vocabulary(frequency_threshold, tuple(values), tuple(counts))

    @property
    def cardinalities(self) -> list[int]:
        return [FIRST_VALUE_ID + int(values.size) for values in self.values]

    def lookup(self, categorical: np.ndarray, dtypes: Sequence[np.dtype] | None = None) -> list[np.ndarray]:
        """Maps a ``[rows, features]`` block of hashes (negative = missing) to one id array per feature."""
        self.prepare()
        ids = []
        for index, table in enumerate(self._tables):
            column = categorical[:, index]
            feature_ids = table.find(column)
            feature_ids[column < 0] = MISSING_ID
            ids.append(feature_ids.astype(dtypes[index]) if dtypes is not None else feature_ids.astype(np.int64))
        return ids

    def save(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        features = []
        for index, (values, counts) in enumerate(zip(self.values, self.counts)):
            name = f"cat_{index}.npy"
            np.save(os.path.join(directory, name), np.stack([values, counts], axis=1).astype(np.int64))
            features.append({"name": f"cat_{index}.bin", "file": name, "kept_values": int(values.size)})
        manifest = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "frequency_threshold": self.frequency_threshold,
            "id_rule": "0 missing, 1 rare or unseen, 2.. kept values by descending count then hash ascending",
            "features": features,
        }
        with open(os.path.join(directory, "manifest.json"), "w", encoding="utf-8") as stream:
            json.dump(manifest, stream, indent=2, sort_keys=True)
            stream.write("\n")

    @staticmethod
    def load(directory: str, num_features: int) -> "Vocabulary":
        """Loads a vocabulary saved by :meth:`save` (``OUTPUT_DIR/vocabulary`` of an earlier run).

        Raises:
            VocabularyError: naming the directory and what is wrong.
        """
        manifest_path = os.path.join(directory, "manifest.json")
        try:
            with open(manifest_path, "r", encoding="utf-8") as stream:
                manifest = json.load(stream)
        except (OSError, json.JSONDecodeError) as error:
            raise VocabularyError(f"--vocab_dir={directory}: cannot read {manifest_path}: {error}") from error
        if manifest.get("format") != FORMAT or manifest.get("version") != FORMAT_VERSION:
            raise VocabularyError(
                f"{manifest_path}: expected format {FORMAT} version {FORMAT_VERSION}. "
                f"Received: {manifest.get('format')} version {manifest.get('version')}"
            )
        if len(manifest["features"]) != num_features:
            raise VocabularyError(
                f"{manifest_path}: expected {num_features} features. Received: {len(manifest['features'])}"
            )
        values, counts = [], []
        for feature in manifest["features"]:
            path = os.path.join(directory, feature["file"])
            try:
                table = np.load(path, allow_pickle=False)
            except (OSError, ValueError) as error:
                raise VocabularyError(f"{path}: cannot read vocabulary of {feature['name']}: {error}") from error
            if table.ndim != 2 or table.shape[1] != 2 or table.shape[0] != feature["kept_values"]:
                raise VocabularyError(f"{path}: expected shape [{feature['kept_values']}, 2]. Received: {table.shape}")
            values.append(table[:, 0].astype(np.int64))
            counts.append(table[:, 1].astype(np.int64))
        return Vocabulary(int(manifest["frequency_threshold"]), tuple(values), tuple(counts))


class _HashTable:
    """Open addressing (linear probing, load <= 1/2) from 32-bit hash to id, probed for a whole block.

    A binary search over a large vocabulary costs ~20 cache misses per value; this costs ~1.5. Each
    slot is one uint64 ``hash << 32 | id``, so a probe is a single gather; ``0`` marks an empty slot
    (real ids start at 2).
    """

    _MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: spreads any bit pattern

    def __init__(self, entries: np.ndarray, bits: int):
        self.entries, self.bits = entries, bits
        self.mask = (1 << bits) - 1

    def _slots(self, values: np.ndarray) -> np.ndarray:
        return ((values.astype(np.uint64) * self._MULTIPLIER) >> np.uint64(64 - self.bits)).astype(np.int64)

    @staticmethod
    def build(values: np.ndarray) -> "_HashTable":
        bits = max(4, int(2 * max(values.size, 1) - 1).bit_length())
        table = _HashTable(np.zeros(1 << bits, np.uint64), bits)
        pending = (values.astype(np.uint64) << np.uint64(32)) | np.arange(
            FIRST_VALUE_ID, FIRST_VALUE_ID + values.size, dtype=np.uint64
        )
        slots = table._slots(values)
        while pending.size:
            free = table.entries[slots] == 0
            # Among entries that want the same free slot, the first takes it; the rest probe on.
            candidates = np.flatnonzero(free)
            _, first = np.unique(slots[candidates], return_index=True)
            winners = candidates[first]
            table.entries[slots[winners]] = pending[winners]
            losers = np.ones(pending.size, dtype=bool)
            losers[winners] = False
            pending = pending[losers]
            slots = (slots[losers] + 1) & table.mask
        return table

    def find(self, values: np.ndarray) -> np.ndarray:
        """int64 id of each value (``0 <= value < 2**32``), RARE_ID where absent."""
        values = values.astype(np.uint64)
        slots = self._slots(values)
        entries = self.entries[slots]
        hit = (entries >> np.uint64(32)) == values
        result = np.where(hit, entries & np.uint64(0xFFFFFFFF), np.uint64(RARE_ID)).astype(np.int64)
        pending = np.flatnonzero(~hit & (entries != 0))  # an occupied slot of another value: probe on
        pending_slots = slots[pending]
        while pending.size:
            pending_slots = (pending_slots + 1) & self.mask
            entries = self.entries[pending_slots]
            hit = (entries >> np.uint64(32)) == values[pending]
            result[pending[hit]] = (entries[hit] & np.uint64(0xFFFFFFFF)).astype(np.int64)
            keep = ~hit & (entries != 0)
            pending, pending_slots = pending[keep], pending_slots[keep]
        return result


def count_tables(tables: Iterable[CountTable]) -> CountTable:
    """Merges any number of count tables in bounded-work steps."""
    accumulator = CountAccumulator()
    for table in tables:
        accumulator.add(table)
    return accumulator.result()
