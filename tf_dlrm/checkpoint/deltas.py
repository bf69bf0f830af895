"""Delta publishing: every K steps, the embedding rows that changed since the last delta, and the dense weights.

A training run (``main.py --delta_every_steps=K --delta_dir=DIR``, or :class:`DeltaWriter` in a loop of your own)
writes one directory per delta under ``DIR``::

    delta-00000040/
        manifest.json                                   written last: format, step, previous_step, tables, files
        tables/table_003.cols_0-8.rows.npy              int64 [n]: the global row ids that changed
        tables/table_003.cols_0-8.values.npy            float32 [n, 8]: their columns [0, 8) at ``step``
        dynamic/table_000.rank_1.keys.npy               dynamic tables: int64 [n] keys whose rows changed (or are new),
        dynamic/table_000.rank_1.values.npy             float32 [n, dim] their rows,
        dynamic/table_000.rank_1.removed_keys.npy       int64 [m] keys that lost their row (evicted), by the rank owning them
        dense/<name>.npy                                every dense weight, whole (small)

A delta holds the rows whose values at ``step`` differ from their values at ``previous_step`` (the step of the
delta before it, or the step the run started from), so applying the deltas of steps ``S0 < S1 < ... < S`` in
order to a model at ``S0`` gives the model at ``S``, bit for bit (:mod:`tf_dlrm.cli.apply_deltas` does it to an
exported SavedModel). Each rank writes the column slices it owns, as a checkpoint does
(:mod:`tf_dlrm.checkpoint.slices`); rank 0 writes the replicated tables and the dense weights.

Which rows changed is found by value, not by tracking the optimizer: each rank keeps a 64-bit fingerprint of every
row it holds (8 bytes a row, beside the row's ``4 * width``; for a dynamic table, of every live key's row, with the
key) and compares the rows against them at each delta.
Whatever moved a row (any sparse optimizer, weight decay, hot-row replicas, a replicated table's dense
update) is caught, and a row updated back to the same bits is rightly left out. The fingerprint is the sum, modulo
2^64, of SplitMix64's finaliser of each column's index and float32 bits: the finaliser is a bijection of 64-bit
words, so a change confined to one column always changes the fingerprint; a change spread over several columns goes
unseen only when the sums of scrambled words collide, about 2^-64 per row. Each delta reads every row this rank
holds once, chunk by chunk.

Atomic as checkpoints are (:mod:`tf_dlrm.checkpoint.store`): a delta is written into a hidden ``.delta-<step>.tmp``,
every file fsynced, the manifest (with each file's size and sha256) written last, then published with one rename.
A directory without a manifest is never a delta: readers skip it, and the chain it would have joined stops there.
Local directories only (no rename of a directory on remote storage). A run that starts (or resumes) at step S
removes the deltas of steps after S it finds there: they belong to the run it replaces.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil

import numpy as np

from tf_dlrm.io import files
from tf_dlrm.parallel import collectives
from tf_dlrm.sharding.dynamic_routing import mix64
from tf_dlrm.embedding.serving import dense_name
from tf_dlrm.embedding.training_step import embedding_layer
from tf_dlrm.embedding.variable_kind import VariableKind, variables_of_kind
from tf_dlrm.checkpoint.slices import chunk_rows

FORMAT = "tf_dlrm.delta"
VERSION = 1
MANIFEST = "manifest.json"
_NAME = re.compile(r"^delta-(\d{8,})$")


class DeltaError(ValueError):
    """A delta that cannot be written, read or applied (the message names it)."""


def delta_name(step: int) -> str:
    return f"delta-{step:08d}"


def dense_variables(model) -> list:
    """The weights a delta carries whole: the model's trainable dense (non-embedding) variables."""
    return variables_of_kind(model.trainable_variables, VariableKind.DENSE)


# ---------------------------------------------------------------------- the fingerprint


def row_fingerprints(values: np.ndarray) -> np.ndarray:
    """``[n]`` uint64: ``sum_c mix64(c * 2^32 + bits(values[:, c])) mod 2^64`` (see the module docstring)."""
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32).astype(np.uint64)
    columns = np.arange(bits.shape[1], dtype=np.uint64) << np.uint64(32)
    with np.errstate(over="ignore"):
        return mix64(bits | columns).sum(axis=1, dtype=np.uint64)  # wraps modulo 2^64, by design


# ---------------------------------------------------------------------- the writer


class DeltaWriter:
    """Writes a delta every ``every_steps`` steps of a training run; every method is collective (all ranks, same order).

    Args:
        model: the model being trained (its embedding layer's fixed tables and its dense weights).
        env: this rank's place (:class:`tf_dlrm.parallel.env.DistributedEnv`).
        directory: where the ``delta-<step>`` directories go (local).
        every_steps: a delta every this many steps (:meth:`on_step`); 0: only when :meth:`write` is called.
        synchronize: called before each delta on every rank (``--hot_row_sync_every`` > 1: merges the hot-row
            replicas, as a checkpoint does), or None.
        say: prints a line (rank 0), or None.

    Call :meth:`start` once with the step the weights are at (0, or a restored checkpoint's step) before training,
    then :meth:`on_step` after each step::

        deltas = DeltaWriter(model, env, "deltas", every_steps=100)
        deltas.start(step)
        for features, labels in dataset:
            step_fn(features, labels)
            step += 1
            deltas.on_step(step)

    Raises:
        DeltaError: a remote ``directory``, or a failed write.
    """

    def __init__(self, model, env, directory: str, every_steps: int = 0, synchronize=None, say=None):
        if files.is_remote(directory):
            raise DeltaError(f"Expected a local --delta_dir (a delta is published by renaming a directory). Received: {directory}")
        if every_steps < 0:
            raise DeltaError(f"Expected --delta_every_steps >= 0. Received: --delta_every_steps={every_steps}")
        self.layer = embedding_layer(model)
        self.dynamic = getattr(self.layer, "dynamic_layer", None)
        self.env, self.directory, self.every_steps = env, directory, every_steps
        self.synchronize, self.say = synchronize, say or (lambda line: None)
        self.tables = [] if self.layer.plan is None else list(self.layer.plan.tables)
        self.dense = [(dense_name(v), v) for v in dense_variables(model)]
        self.fingerprints: dict[tuple[int, int, int], np.ndarray] = {}  # (table, first row, first column)
        # Dynamic tables: per table, this rank's live keys (ascending) and their rows' fingerprints.
        self.key_prints: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.last_step: int | None = None

    def _pieces(self):
        """(table index, piece) of every piece this rank writes (rank 0 writes the replicated tables)."""
        for table in range(len(self.tables)):
            for piece in self.layer.table_pieces(table):
                if piece.replicated and not self.env.is_chief:
                    continue
                yield table, piece

    def _scan(self, table: int, piece):
        """``(fingerprints, changed ids, their values)`` of one piece against its last fingerprints (all rows
        count as changed when there are none)."""
        first = piece.row_start  # a row band's fingerprints start at its first row; the ids written are the table's
        known = self.fingerprints.get((table, piece.row_start, piece.column_start))
        step = chunk_rows(piece.width)
        prints, ids, values = np.empty(piece.rows, np.uint64), [], []
        for start in range(piece.row_start, piece.row_end, step):
            stop = min(piece.row_end, start + step)
            chunk = self.layer.read_piece_rows(piece, start, stop)
            prints[start - first:stop - first] = row_fingerprints(chunk)
            changed = np.arange(start, stop) if known is None else \
                start + np.flatnonzero(prints[start - first:stop - first] != known[start - first:stop - first])
            if changed.size:
                ids.append(changed)
                values.append(chunk[changed - start])
        ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
        values = np.concatenate(values) if values else np.zeros((0, piece.width), np.float32)
        return prints, ids.astype(np.int64), values.astype(np.float32)

    def start(self, step: int) -> None:
        """Fingerprints the weights as they are at ``step``: the first delta holds what changes after it. Rank 0
        removes the deltas after ``step`` (an earlier run's, which this one replaces) and unfinished ones."""
        removed = []
        if self.env.is_chief:
            os.makedirs(self.directory, exist_ok=True)
            for name in os.listdir(self.directory):
                path = os.path.join(self.directory, name)
                match = _NAME.match(name)
                if name.startswith(".delta-") and name.endswith(".tmp"):
                    shutil.rmtree(path, ignore_errors=True)
                elif match and int(match.group(1)) > step:
                    if os.path.isfile(os.path.join(path, MANIFEST)):
                        os.remove(os.path.join(path, MANIFEST))  # first: a half-removed delta is never taken for one
                    shutil.rmtree(path)
                    removed.append(name)
        if removed:
            self.say(f"deltas: removed {', '.join(sorted(removed))} under {self.directory}: they are later than step {step}, "
                     "where this run starts")
        for table, piece in self._pieces():
            self.fingerprints[(table, piece.row_start, piece.column_start)] = self._scan(table, piece)[0]
        for table in self._dynamic_tables():
            self.key_prints[table] = self._scan_keys(table)[0]
        self.last_step = step

    def _dynamic_tables(self) -> range:
        return range(0 if self.dynamic is None else len(self.dynamic.table_configs))

    def _scan_keys(self, table: int):
        """``((keys, fingerprints), changed keys, their rows, removed keys)`` of this rank's shards of dynamic
        ``table`` against the last delta: a key is changed when it is new or its row's bits differ (a key evicted and
        given a row again is too), removed when it had a row then and has none now."""
        keys, values = self.dynamic.local_rows(table)
        order = np.argsort(keys, kind="stable")
        keys, values = keys[order].astype(np.int64), values[order].astype(np.float32)
        prints = row_fingerprints(values)
        known_keys, known_prints = self.key_prints.get(table, (np.zeros(0, np.int64), np.zeros(0, np.uint64)))
        if known_keys.size:
            place = np.minimum(np.searchsorted(known_keys, keys), known_keys.size - 1)
            changed = (known_keys[place] != keys) | (known_prints[place] != prints)
        else:
            changed = np.ones(keys.size, bool)
        removed = known_keys[~np.isin(known_keys, keys)]
        return (keys, prints), keys[changed], values[changed], removed

    def on_step(self, step: int) -> str | None:
        """Writes a delta when ``step`` is a multiple of ``every_steps``; returns its path (else None)."""
        if self.every_steps and step % self.every_steps == 0 and step != self.last_step:
            return self.write(step)
        return None

    def write(self, step: int) -> str:
        """Writes and publishes the delta of ``step`` (rows changed since the last one); returns its path."""
        if self.last_step is None:
            raise DeltaError("DeltaWriter.start(step) must be called before the first delta")
        if self.synchronize is not None:
            self.synchronize()
        final = os.path.join(self.directory, delta_name(step))
        temporary = os.path.join(self.directory, f".{delta_name(step)}.tmp")
        error = None
        if self.env.is_chief:
            try:
                if os.path.exists(final):
                    raise DeltaError(f"{final} exists already")
                shutil.rmtree(temporary, ignore_errors=True)
                os.makedirs(os.path.join(temporary, "tables"))
            except (OSError, DeltaError) as failure:
                error = f"cannot write delta {final}: {failure}"
        error = collectives.broadcast_json(self.env, error, "delta_prepare")
        records, written, fresh, dynamic_records, fresh_keys = [], {}, {}, [], {}
        if error is None:
            try:
                for table, piece in self._pieces():
                    prints, ids, values = self._scan(table, piece)
                    fresh[(table, piece.row_start, piece.column_start)] = prints
                    if not ids.size:
                        continue
                    band = "" if (piece.row_start, piece.row_end) == (0, self.layer.cardinalities[table]) else \
                        f".rows_{piece.row_start}-{piece.row_end}"
                    stem = f"tables/table_{table:03d}{band}.cols_{piece.column_start}-{piece.column_end}"
                    written[f"{stem}.rows.npy"] = _write_npy(temporary, f"{stem}.rows.npy", ids)
                    written[f"{stem}.values.npy"] = _write_npy(temporary, f"{stem}.values.npy", values)
                    records.append({"table": table, "columns": [piece.column_start, piece.column_end], "count": int(ids.size),
                                    "rows": f"{stem}.rows.npy", "values": f"{stem}.values.npy"})
                dynamic_records, fresh_keys = self._write_dynamic(temporary, written)
            except OSError as failure:
                error = f"rank {self.env.rank} cannot write delta {final}: {failure}"
        gathered = collectives.allgather_json(self.env, {"records": records, "dynamic": dynamic_records if error is None else [],
                                                         "files": written, "error": error}, "delta_pieces")
        error = next((g["error"] for g in gathered if g["error"]), None)
        if self.env.is_chief and error is None:
            try:
                self._publish(step, temporary, final, gathered)
            except OSError as failure:
                error = f"cannot publish delta {final}: {failure}"
        if self.env.is_chief and error is not None:
            shutil.rmtree(temporary, ignore_errors=True)
        error = collectives.broadcast_json(self.env, error, "delta_status")
        if error:
            raise DeltaError(error)
        # Only a published delta moves the baseline: after a failed one the next delta still holds those rows.
        self.fingerprints.update(fresh)
        self.key_prints.update(fresh_keys)
        previous, self.last_step = self.last_step, step
        changed = sum(r["count"] for g in gathered for r in g["records"] + g["dynamic"])
        self.say(f"published delta {final} (steps {previous} -> {step}: {changed} changed row slices, "
                 f"{len(self.dense)} dense weights)")
        return final

    def _write_dynamic(self, temporary: str, written: dict) -> tuple[list, dict]:
        """Writes this rank's changed keys, their rows and its removed keys of every dynamic table; returns the
        records and the new fingerprints."""
        records, fresh = [], {}
        for table in self._dynamic_tables():
            fresh[table], keys, values, removed = self._scan_keys(table)
            if not keys.size and not removed.size:
                continue
            stem = f"dynamic/table_{table:03d}.rank_{self.env.rank}"
            record = {"table": table, "rank": self.env.rank, "count": int(keys.size), "removed": int(removed.size)}
            for field, array in (("keys", keys), ("values", values), ("removed_keys", removed)):
                record[field] = f"{stem}.{field}.npy"
                written[record[field]] = _write_npy(temporary, record[field], array)
            records.append(record)
        return records, fresh

    def _publish(self, step: int, temporary: str, final: str, gathered: list) -> None:
        written = {}
        for entry in gathered:
            written.update(entry["files"])
        dense = []
        for name, variable in self.dense:
            file = f"dense/{_file_safe(name)}.npy"
            written[file] = _write_npy(temporary, file, variable.numpy().astype(np.float32))
            dense.append({"name": name, "file": file, "shape": list(variable.shape)})
        pieces = [record for entry in gathered for record in entry["records"]]
        manifest = {
            "format": FORMAT, "version": VERSION, "step": int(step), "previous_step": int(self.last_step),
            "world_size": self.env.world_size,
            "tables": [{"name": table.name, "rows": int(self.layer.cardinalities[index]), "dim": int(table.dim),
                        "pieces": sorted((p for p in pieces if p["table"] == index), key=lambda p: p["columns"])}
                       for index, table in enumerate(self.tables)],
            "dynamic": [] if self.dynamic is None else [
                {"name": config.name, "dim": int(config.embedding_dim),
                 "pieces": sorted((r for g in gathered for r in g["dynamic"] if r["table"] == index), key=lambda r: r["rank"])}
                for index, config in enumerate(self.dynamic.table_configs)],
            "dense": dense,
            "files": written,
        }
        for folder in ("tables", "dynamic", "dense"):  # the other ranks' files were fsynced by their writers
            if os.path.isdir(os.path.join(temporary, folder)):
                files.sync_directory(os.path.join(temporary, folder))
        with open(os.path.join(temporary, MANIFEST), "w", encoding="utf-8") as handle:  # last: it publishes the contents
            json.dump(manifest, handle, indent=1)
            files.sync(handle)
        files.sync_directory(temporary)
        os.rename(temporary, final)  # the one atomic step that makes the delta exist
        files.sync_directory(self.directory)


def _file_safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]", ".", name)


def _write_npy(root: str, name: str, array: np.ndarray) -> dict:
    """Writes ``root/name`` (fsynced); returns ``{"bytes", "sha256"}``."""
    path = os.path.join(root, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        np.save(handle, np.ascontiguousarray(array), allow_pickle=False)
        files.sync(handle)
    return {"bytes": os.path.getsize(path), "sha256": _sha256(path)}


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(8 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------------- reading a chain


def published(directory: str) -> list[tuple[int, str]]:
    """``(step, path)`` of every published delta under ``directory`` (those holding a manifest), by step."""
    if not os.path.isdir(directory):
        raise DeltaError(f"--delta_dir={directory} is not a directory")
    found = []
    for name in os.listdir(directory):
        match = _NAME.match(name)
        if match and os.path.isfile(os.path.join(directory, name, MANIFEST)):
            found.append((int(match.group(1)), os.path.join(directory, name)))
    return sorted(found)


def _unpublished(directory: str, after: int, before: int) -> list[str]:
    """Names of ``delta-<step>`` directories without a manifest, ``after < step < before``: writes that never finished."""
    names = []
    for name in sorted(os.listdir(directory)):
        match = _NAME.match(name)
        if match and after < int(match.group(1)) < before and not os.path.isfile(os.path.join(directory, name, MANIFEST)):
            names.append(name)
    return names


def read_manifest(path: str) -> dict:
    """A delta's manifest, its format and fields checked (a file name must stay inside the delta)."""
    try:
        with open(os.path.join(path, MANIFEST), encoding="utf-8") as handle:
            manifest = json.load(handle)
    except (OSError, ValueError) as error:
        raise DeltaError(f"delta {path}: cannot read its {MANIFEST}: {error}") from error
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise DeltaError(f"delta {path}: not a {FORMAT} version {VERSION} manifest")
    for key in ("step", "previous_step", "tables", "dense", "files"):
        if key not in manifest:
            raise DeltaError(f"delta {path}: its manifest has no {key!r}")
    for name in manifest["files"]:
        if os.path.isabs(name) or ".." in name.split("/"):
            raise DeltaError(f"delta {path}: file {name} points outside the delta")
    return manifest


def verify(path: str, manifest: dict) -> None:
    """Every file of the delta has the size and sha256 its manifest says; raises :class:`DeltaError` naming the first that does not."""
    for name, entry in manifest["files"].items():
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            raise DeltaError(f"delta {path}: file {name} is missing")
        if os.path.getsize(file) != entry["bytes"] or _sha256(file) != entry["sha256"]:
            raise DeltaError(f"delta {path}: file {name} fails its size or sha256 check: corrupt or modified; refusing it")


def load(path: str, name: str, manifest: dict) -> np.ndarray:
    """One verified array of a delta (``.npy``, no pickles)."""
    if name not in manifest["files"]:
        raise DeltaError(f"delta {path}: file {name} is not in its manifest")
    try:
        return np.load(os.path.join(path, name), allow_pickle=False)
    except (OSError, ValueError) as error:
        raise DeltaError(f"delta {path}: file {name} is not a plain .npy array: {error}") from error


def chain(directory: str, from_step: int, up_to_step: int | None = None) -> list[tuple[str, dict]]:
    """The deltas that take a model at ``from_step`` to ``up_to_step`` (None: as far as the chain goes), in order:
    ``(path, manifest)`` each, every file verified.

    Deltas of steps at or before ``from_step`` are in the model already and skipped. Raises :class:`DeltaError`,
    naming the delta, on a gap (a delta whose previous step is not where the chain is: a missing or unpublished
    delta), on a delta that began before ``from_step`` (the model is not at a step a delta starts from), and when
    no delta reaches ``up_to_step``.
    """
    at, picked = from_step, []
    for step, path in published(directory):
        if step <= from_step:
            continue
        if up_to_step is not None and step > up_to_step:
            break
        manifest = read_manifest(path)
        if manifest["step"] != step:
            raise DeltaError(f"delta {path}: its manifest says step {manifest['step']}")
        previous = manifest["previous_step"]
        if previous < from_step and at == from_step:
            raise DeltaError(f"delta {path} holds the changes of steps {previous} -> {step}, which begin before step "
                             f"{from_step} where the model is: it is older than the model and cannot update it (apply "
                             f"deltas to an export of step {previous}, or of a step a later delta starts from)")
        if previous != at:
            unfinished = _unpublished(directory, at, step)
            why = f" ({', '.join(unfinished)} has no manifest: a write that never finished)" if unfinished else ""
            raise DeltaError(f"delta {path} follows step {previous}, but the chain is at step {at}: the changes of steps "
                             f"{at} -> {previous} are missing{why}; refusing a gap")
        verify(path, manifest)
        picked.append((path, manifest))
        at = step
    if up_to_step is not None and at != up_to_step:
        raise DeltaError(f"no published delta under {directory} reaches step {up_to_step}: the chain from step {from_step} "
                         f"ends at step {at}")
    return picked
