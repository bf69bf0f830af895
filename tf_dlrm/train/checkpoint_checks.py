"""What a restore checks before any weight changes: which checkpoint, and that it fits this run.

Rank 0 runs :meth:`RestoreChecks._check` before the collective restore: the checkpoint chosen
(``--resume`` or ``--restore_checkpoint_path``), every file's checksum, the spec, the tables'
shapes, dense weights, optimizer and loss-scale state, the data position, dynamic tables. A mixin
of :class:`tf_dlrm.train.checkpoint.Checkpointer`, whose attributes it reads.
"""

from __future__ import annotations

import os

from tf_dlrm.train import checkpoint_dynamic as dynamic_tables
from tf_dlrm.train import checkpoint_embedding_state as embedding_state
from tf_dlrm.train.checkpoint_choice import check_same_data, newest_intact
from tf_dlrm.train.checkpoint_slices import open_slices
from tf_dlrm.train.checkpoint_store import (
    CheckpointError, check_compatible, latest_checkpoint, list_checkpoints, load_array, read_manifest, resolve,
    verify_files,
)


class RestoreChecks:
    """Chooses and verifies the checkpoint to restore (see the module docstring)."""

    def _choose(self, restore_path: str | None, resume: bool, for_training: bool) -> tuple[str | None, list[str], bool]:
        """The checkpoint to load, the lines saying which newer ones were skipped and why, and whether
        its files' checksums were verified already (the search for the newest intact one did)."""
        skipped = []
        if resume and self.save_path:
            latest, skipped = newest_intact(self.save_path, move_aside=for_training)
            if latest:
                return latest, skipped, True
        if restore_path:
            return resolve(restore_path), skipped, False
        return None, skipped, False

    def _is_own(self, directory: str) -> bool:
        """Whether ``directory`` is one of this run's checkpoints (under ``--save_checkpoint_path``)."""
        return bool(self.save_path) and os.path.dirname(os.path.abspath(directory)) == os.path.abspath(self.save_path)

    def _check(self, restore_path, resume: bool, for_training: bool, required: bool) -> dict:
        """Rank 0: picks and fully verifies the checkpoint before any weight changes."""
        if for_training and self.save_path and not resume and list_checkpoints(self.save_path):
            raise CheckpointError(
                f"--save_checkpoint_path={self.save_path} already holds checkpoints (latest "
                f"{os.path.basename(latest_checkpoint(self.save_path))}): pass --resume to continue from it, "
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
        check_compatible(directory, manifest, self.spec, self.model_config, self.model_identity)
        dynamic_tables.check(directory, manifest, self.embedding, self.trainer.sparse.slot_names if for_training else None)
        names = [n for n, _ in self.dense]
        if [d["name"] for d in manifest["dense"]] != names:
            raise CheckpointError(f"checkpoint {directory}: dense weights {[d['name'] for d in manifest['dense']]}, the model has {names}")
        if for_training:
            self._check_training(directory, manifest)
            if resume and self.data and self._is_own(directory):
                check_same_data(directory, manifest, self.data, self.spec.source)
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
            "learning_rate": float(manifest.get("learning_rate", 0.0)),
            "tables": manifest["tables"],  # with their slices: every rank reads its own columns
            "dense": [d["file"] for d in manifest["dense"]],
            "optimizer_state": [s["file"] for s in manifest["optimizer_state"]],
            "loss_scale": [s["file"] for s in manifest["loss_scale"]] if self._loss_scale_matches(manifest) else [],
        }

    def _table_shapes(self) -> tuple[list[int], list[int]]:
        """Widths and rows of every table of the model (the categorical features' tables, then the
        width-1 tables of DeepFM and Wide & Deep), in plan order."""
        return [t.dim for t in self.fixed_tables], [t.rows for t in self.fixed_tables]

    def _loss_scale_matches(self, manifest: dict) -> bool:
        return bool(self.loss_scale) and [s["name"] for s in manifest.get("loss_scale", [])] == [n for n, _ in self.loss_scale]

    def _check_training(self, directory: str, manifest: dict) -> None:
        saved = manifest["optimizer"].get("name")
        if saved != self.trainer.config.optimizer:
            raise CheckpointError(
                f"checkpoint {directory} was trained with --optimizer={saved}; the flags give "
                f"--optimizer={self.trainer.config.optimizer}, whose state cannot be restored from it"
            )
        names = [n for n, _ in self.optimizer_state]
        if [s["name"] for s in manifest["optimizer_state"]] != names:
            raise CheckpointError(f"checkpoint {directory}: optimizer state {[s['name'] for s in manifest['optimizer_state']]}, expected {names}")
        position, step = manifest["position"], manifest["step"]
        if self.steps_per_epoch and [position.get("epoch"), position.get("batch")] != list(divmod(step, self.steps_per_epoch)):
            raise CheckpointError(
                f"checkpoint {directory} stopped at epoch {position.get('epoch')}, batch {position.get('batch')} of "
                f"{position.get('steps_per_epoch')} (--batch_size={position.get('batch_size')}); with --batch_size="
                f"{self.batch_size} this dataset has {self.steps_per_epoch} batches per epoch and step {step} would "
                "land elsewhere: resume with the same --batch_size and dataset"
            )
