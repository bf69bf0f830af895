"""What a restore checks before any weight changes: which checkpoint, and that it fits this run.

Rank 0 runs :meth:`RestoreChecks._check` before the collective restore: the checkpoint chosen
(``--resume`` or ``--restore_checkpoint_path``), every file's checksum, the spec, the tables'
shapes, dense weights, optimizer and loss-scale state, the data position, dynamic tables. A mixin
of :class:`tf_dlrm.checkpoint.checkpointer.Checkpointer`, whose attributes it reads.

Which checkpoint a run may continue from, and whether its data still matches (plain files, no TF):

- :func:`newest_intact`: ``--resume`` takes the newest checkpoint whose manifest parses and whose
  files pass their size and sha256 checks; newer ones that fail are skipped with the reason and, when
  training, renamed aside (``ckpt-<step>.corrupt``, never deleted) so that the run can save that step
  again. The checkpoint chosen is held against its run's retention until every rank has read it
  (:mod:`tf_dlrm.checkpoint.lock`).
- :func:`data_record` / :func:`check_same_data`: a checkpoint records the global batch size, the
  training split's sample count and a fingerprint of its files; ``--resume`` refuses a different
  batch size or dataset, because the data position (``step`` batches of the seeded order) would then
  point at other samples. Continuing at the exact sample position instead is not offered.
"""

from __future__ import annotations

import contextlib
import hashlib

from tf_dlrm.checkpoint import dynamic_tables, lock
from tf_dlrm.checkpoint import embedding_state
from tf_dlrm.checkpoint.slices import open_slices
from tf_dlrm.checkpoint.store import (
    MANIFEST, CheckpointError, check_compatible, latest_checkpoint, list_checkpoints, load_array, read_manifest, resolve,
    verify_files,
)
from tf_dlrm.io import files

_EDGE_BYTES = 1 << 16  # bytes hashed at each end of every data file


def newest_intact(save_path: str, move_aside: bool, held: contextlib.ExitStack | None = None,
                  corrupt: list[str] | None = None, keep_if_none_intact: bool = False) -> tuple[str | None, list[str]]:
    """The newest checkpoint under ``save_path`` that verifies, and one line per newer one skipped.
    With ``held``, the one returned stays held against retention (:func:`tf_dlrm.checkpoint.lock.reading`)
    until ``held`` closes: each candidate is held before its files are read, so a checkpoint deleted
    by its run's retention meanwhile is skipped as such, never taken for a corrupt one. ``corrupt``, when
    given, receives the corrupt ones' paths when none is intact."""
    skipped, found = [], []
    for _, path in reversed(list_checkpoints(save_path)):
        candidate = contextlib.ExitStack()
        try:
            if held is not None:
                candidate.enter_context(lock.reading(path))
            verify_files(path, read_manifest(path))
        except lock.CheckpointVanished as gone:
            skipped.append(f"skipped checkpoint {path}: {gone} (by its run's retention)")
            continue
        except CheckpointError as error:
            candidate.close()
            found.append((len(skipped), path))
            skipped.append(f"skipped checkpoint {path}: {error}")
            continue
        if held is not None:
            held.enter_context(candidate)
        _move_aside(found, skipped, move_aside)
        return path, skipped
    # None intact: with ``keep_if_none_intact`` they stay where they are, so that the refusal that
    # follows (see RestoreChecks._refuse_all_corrupt) says the same on every later --resume.
    _move_aside(found, skipped, move_aside and not keep_if_none_intact)
    if corrupt is not None:
        corrupt.extend(path for _, path in found)
    return None, skipped


def _move_aside(found: list[tuple[int, str]], skipped: list[str], move: bool) -> None:
    """Moves each corrupt checkpoint of ``found`` (its line's index, its path) aside, saying so in its line."""
    if not move:
        return
    for index, path in found:
        aside = _aside_name(path)
        files.move_tree(path, aside, first=(MANIFEST,))
        skipped[index] += f"; moved it aside to {aside}"


def _aside_name(path: str) -> str:
    """``ckpt-N.corrupt``, or ``ckpt-N.corrupt-2``, ... when a run before this one moved one aside already."""
    aside, number = f"{path}.corrupt", 1
    while files.exists(aside):
        number += 1
        aside = f"{path}.corrupt-{number}"
    return aside


def latest(save_path: str | None) -> str | None:
    """The newest published checkpoint under ``save_path`` (None when there is none or no path)."""
    found = list_checkpoints(save_path) if save_path else []
    return found[-1][1] if found else None


def _fingerprint(paths) -> str:
    """sha256 of each file's name, size and first and last 64 KiB: cheap, and changes with the data."""
    digest = hashlib.sha256()
    for path in paths:
        size = files.getsize(path)
        digest.update(f"{files.basename(path)}:{size}:".encode())
        with files.open_file(path, "rb") as handle:
            digest.update(handle.read(_EDGE_BYTES))
            handle.seek(max(0, size - _EDGE_BYTES))
            digest.update(handle.read(_EDGE_BYTES))
    return digest.hexdigest()


def data_record(reader, batch_size: int) -> dict:
    """What a training checkpoint records of its data: batch size, sample count, fingerprint."""
    files = getattr(reader, "files", None)  # synthetic in-memory batches have no files
    record = {"batch_size": int(batch_size), "train_samples": int(reader.num_samples)}
    if files is not None:
        paths = [files.label] + ([files.numerical] if files.numerical else []) + list(files.categorical)
        paths += [path for path in files.lengths if path]  # variable-length features' lengths files
        record["train_fingerprint"] = _fingerprint(paths)
    return record


def check_same_data(directory: str, manifest: dict, current: dict, where: str) -> None:
    """Refuses to resume from ``directory`` when its batch size or training data differ from ``current``."""
    saved = {**manifest.get("data", {})}
    saved.setdefault("batch_size", manifest.get("position", {}).get("batch_size"))
    if saved.get("batch_size") is not None and saved["batch_size"] != current["batch_size"]:
        raise CheckpointError(
            f"checkpoint {directory} was trained with --batch_size={saved['batch_size']}; the flags give "
            f"--batch_size={current['batch_size']}, with which step {manifest['step']} would point at other "
            "samples: resume with the same --batch_size, or start a new --save_checkpoint_path"
        )
    for key, what in (("train_samples", "samples"), ("train_fingerprint", "file fingerprint")):
        if key in saved and key in current and saved[key] != current[key]:
            raise CheckpointError(
                f"checkpoint {directory} was trained on a different training split ({what} {saved[key]}) than "
                f"{where} ({current[key]}): resume on the same dataset, or start a new --save_checkpoint_path"
            )


def check_names(directory: str, what: str, saved: list[dict], variables: list[tuple], by_name: bool) -> None:
    """The saved entries fit the model's variables: by name between two ``main.py`` runs (the same model, built
    the same way); else one for one in order, each shape checked as it is read: Keras numbers a library
    model's unnamed layers per process (``dense``, ``dense_1``), so a script's names need not be another's."""
    names = [name for name, _ in variables]
    if [entry["name"] for entry in saved] != names and (by_name or len(saved) != len(names)):
        raise CheckpointError(f"checkpoint {directory}: {what} {[entry['name'] for entry in saved]}, the model has {names}")


class RestoreChecks:
    """Chooses and verifies the checkpoint to restore (see the module docstring)."""

    def _choose(self, restore_path: str | None, resume: bool, for_training: bool) -> tuple[str | None, list[str], bool]:
        """The checkpoint to load, the lines saying which newer ones were skipped and why, and whether
        its files' checksums were verified already (the search for the newest intact one did)."""
        skipped, corrupt = [], []
        held = getattr(self, "_held", None)
        if resume and self.save_path:
            restart = getattr(self, "restart_if_all_corrupt", False)
            latest, skipped = newest_intact(self.save_path, move_aside=for_training, held=held, corrupt=corrupt,
                                            keep_if_none_intact=not restart)
            if latest:
                return latest, skipped, True
            if corrupt and not restore_path:
                self._refuse_all_corrupt(corrupt, skipped)
        if restore_path:
            for attempt in range(3):
                directory = resolve(restore_path)
                try:
                    if held is not None:
                        held.enter_context(lock.reading(directory))
                    return directory, skipped, False
                except lock.CheckpointVanished as gone:
                    # A directory of checkpoints: its newest was deleted as it was chosen; the next one.
                    if attempt == 2 or files.absolute(directory) == files.absolute(restore_path):
                        raise
                    skipped.append(f"{gone} (by its run's retention); taking the newest one left")
        return None, skipped, False

    def _refuse_all_corrupt(self, corrupt: list[str], skipped: list[str]) -> None:
        """``--resume`` that finds checkpoints, all corrupt, is no fresh start: it stops, naming them,
        unless the run was told to start over (``--restart_if_all_corrupt``)."""
        if getattr(self, "restart_if_all_corrupt", False):
            skipped.append(f"every checkpoint under {self.save_path} is corrupt: starting from step 0 "
                           "(--restart_if_all_corrupt)")
            return
        names = ", ".join(files.basename(path) for path in corrupt)
        first = next(line for line in skipped if line.startswith(f"skipped checkpoint {corrupt[0]}:"))
        first = first.removeprefix("skipped checkpoint ")
        raise CheckpointError(
            f"--resume found only corrupt checkpoints under --save_checkpoint_path={self.save_path}, left where they are: "
            f"{names} ({first}). Expected an intact checkpoint to resume from. Received: {len(corrupt)} corrupt, 0 intact. "
            "Pass --restart_if_all_corrupt to move them aside and start from step 0")

    def _is_own(self, directory: str) -> bool:
        """Whether ``directory`` is one of this run's checkpoints (under ``--save_checkpoint_path``)."""
        return bool(self.save_path) and files.dirname(files.absolute(directory)) == files.absolute(self.save_path)

    def _check(self, restore_path, resume: bool, for_training: bool, required: bool, own: bool = False) -> dict:
        """Rank 0: picks and fully verifies the checkpoint before any weight changes (``own``: one this
        run saved, read back: no guard against a directory holding checkpoints)."""
        if for_training and self.save_path and not resume and not own and list_checkpoints(self.save_path):
            raise CheckpointError(
                f"--save_checkpoint_path={self.save_path} already holds checkpoints (latest "
                f"{files.basename(latest_checkpoint(self.save_path))}): pass --resume to continue from it, "
                "or choose another directory"
            )
        directory, skipped, verified = self._choose(restore_path, resume, for_training)
        if directory is None:
            if required:
                raise CheckpointError("no checkpoint to restore: give --restore_checkpoint_path (or --resume with --save_checkpoint_path)")
            note = f"no {'intact ' if skipped else ''}checkpoint under {self.save_path} yet: starting from step 0" if resume else ""
            return {"path": None, "note": note, "skipped": skipped}
        manifest = read_manifest(directory)
        if not verified:  # hashing a large checkpoint twice would double the restore's slowest part
            verify_files(directory, manifest)
        dynamic_tables.check_kind(directory, manifest, self.dynamic)  # before the spec comparison: the clearer error
        if manifest.get("model") is not None and self.spec is not None:  # both saved and restored by main.py
            check_compatible(directory, manifest, self.spec, self.model_config, self.model_identity)
        dynamic_tables.check(directory, manifest, self.embedding, self.trainer.sparse.slot_names if for_training else None)
        check_names(directory, "dense weights", manifest["dense"], self.dense, manifest.get("model") is not None and self.spec is not None)
        if for_training:
            self._check_training(directory, manifest)
            if resume and self.data and self._is_own(directory):
                check_same_data(directory, manifest, self.data, self.spec.source)
            saved_seed = manifest.get("rng", {}).get("seed")
            if resume and self._is_own(directory) and saved_seed is not None and saved_seed != self.seed:
                raise CheckpointError(
                    f"checkpoint {directory} was trained with --seed={saved_seed}; the flags give --seed={self.seed}, "
                    "with which the batches after its step would come in another order than the run's: resume with "
                    f"--seed={saved_seed}, or start a new --save_checkpoint_path")
        # Every array's header (and the small arrays whole) before any collective: rank 0 must not
        # fail half-way through a restore while the other ranks wait for it.
        widths, cardinalities = self._table_shapes()
        if len(manifest["tables"]) != len(cardinalities):
            raise CheckpointError(f"checkpoint {directory}: {len(manifest['tables'])} tables, the model has {len(cardinalities)}")
        for entry, rows, width in zip(manifest["tables"], cardinalities, widths):
            open_slices(directory, entry, rows, width)
        pairs = list(zip(manifest["dense"], self.dense))
        if for_training:
            pairs += list(zip(manifest["optimizer_state"], self.optimizer_state))
            if self._loss_scale_matches(manifest):
                pairs += list(zip(manifest["loss_scale"], self.loss_scale))
        for entry, (_, variable) in pairs:
            load_array(directory, entry["file"], variable.shape, variable.dtype)
        state_files = embedding_state.check(directory, manifest, self.trainer, cardinalities, widths) if for_training else []
        return {
            "dynamic": manifest.get(dynamic_tables.MANIFEST_KEY),
            "embedding_state": state_files,
            "path": directory,
            "skipped": skipped,
            "step": manifest["step"],
            "learning_rate": None if manifest.get("learning_rate") is None else float(manifest["learning_rate"]),
            "tables": manifest["tables"],  # with their slices: every rank reads its own columns
            "dense": [d["file"] for d in manifest["dense"]],
            "optimizer_state": [s["file"] for s in manifest["optimizer_state"]],
            "loss_scale": [s["file"] for s in manifest["loss_scale"]] if self._loss_scale_matches(manifest) else [],
            "selection": manifest.get("selection"),  # --keep_best's choice so far, for a resumed run
            "calibration": manifest.get("calibration"),  # tf_dlrm.calibration's record, fitted at the end of training
        }

    def _table_shapes(self) -> tuple[list[int], list[int]]:
        """Widths and rows of every table of the model (the categorical features' tables, then the
        width-1 tables of DeepFM and Wide & Deep), in plan order."""
        return [t.dim for t in self.fixed_tables], [t.rows for t in self.fixed_tables]

    def _loss_scale_matches(self, manifest: dict) -> bool:
        return bool(self.loss_scale) and [s["name"] for s in manifest.get("loss_scale", [])] == [n for n, _ in self.loss_scale]

    def _check_training(self, directory: str, manifest: dict) -> None:
        saved, config = manifest["optimizer"].get("name"), getattr(self.trainer, "config", None)
        if saved is not None and config is not None and saved != config.optimizer:
            raise CheckpointError(
                f"checkpoint {directory} was trained with --optimizer={saved}; the flags give "
                f"--optimizer={config.optimizer}, whose state cannot be restored from it"
            )
        check_names(directory, "optimizer state", manifest["optimizer_state"], self.optimizer_state,
                     manifest.get("model") is not None and self.spec is not None)
        position, step = manifest["position"], manifest["step"]
        # A library model's checkpoint records no data position (its script fed its own batches).
        if self.steps_per_epoch and position.get("steps_per_epoch") and \
                [position.get("epoch"), position.get("batch")] != list(divmod(step, self.steps_per_epoch)):
            raise CheckpointError(
                f"checkpoint {directory} stopped at epoch {position.get('epoch')}, batch {position.get('batch')} of "
                f"{position.get('steps_per_epoch')} (--batch_size={position.get('batch_size')}); with --batch_size="
                f"{self.batch_size} this dataset has {self.steps_per_epoch} batches per epoch and step {step} would "
                "land elsewhere: resume with the same --batch_size and dataset"
            )
