"""Checkpoints of a hybrid-parallel DLRM run: save, verify, restore on any world size and plan.

:class:`Checkpointer` collects a run's state (the Trainer's MLP, optimizer, loss scale, step and
learning rate, and the sharded embedding tables) and writes or restores it in the on-disk format
of :mod:`tf_dlrm.checkpoint.store` (layout, manifest, checksums, safe reading, atomic
publish, retention).

Saving and restoring are **collective** (every rank calls them at the same point). Tables and
their optimizer state are **sharded** (:mod:`tf_dlrm.checkpoint.slices`): every rank writes
the slices it owns into rank 0's temporary directory, in parallel and chunk by chunk, and the
manifest lists each table's slices by column range; a restore under any world size and plan reads
on each rank only the column ranges it now owns. No table is ever gathered whole, so a table may be
larger than any one process's memory. Rank 0 writes the dense weights and the manifest (after
gathering every rank's file records) and publishes the checkpoint; before a restore it verifies the
whole checkpoint. An error any rank meets is gathered or broadcast, so that every rank raises it.
(Several machines need one filesystem for the checkpoint directory, as for dynamic tables.)

Data position and RNG: the reader's batch order is a pure function of ``(seed, epoch)`` and
training draws no other random numbers, so the step, ``(epoch, batch)`` of the next batch and
the seed restore the data stream exactly.

Dynamic tables (:mod:`tf_dlrm.embedding.dynamic`) have no full-table layout: every rank writes its rows into
the same temporary directory (:mod:`tf_dlrm.checkpoint.dynamic_tables`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time

import yaml

from tf_dlrm.parallel import collectives
from tf_dlrm.checkpoint import dynamic_tables, lock
from tf_dlrm.checkpoint import embedding_state
from tf_dlrm.checkpoint import slices
from tf_dlrm.checkpoint import store
from tf_dlrm.checkpoint.checks import RestoreChecks
from tf_dlrm.embedding.training_step import embedding_layer
from tf_dlrm.io import files
from tf_dlrm.train.guards import non_finite_arrays
from tf_dlrm.train.memory_watch import MemoryWatch
from tf_dlrm.checkpoint.store import (
    FORMAT, MODEL_CONFIG, SPEC_COPY, VERSION, CheckpointError, latest_checkpoint, load_array, model_record,
)

# Test-only: seconds rank 0 sleeps after writing each table, to kill a run in the middle of a save.
DELAY_ENV = "TF_DLRM_TEST_CHECKPOINT_DELAY_S"


# ---------------------------------------------------------------------- save and restore a run


def _relative(path: str) -> str:
    """A variable path without its model's name: ``dlrm/bottom_mlp/dense_0/kernel`` -> ``bottom_mlp/dense_0/kernel``."""
    return path.split("/", 1)[1] if "/" in path else path


def _memory_line(figures: list[dict]) -> str:
    busiest = max(figures, key=lambda f: f["peak_rss_mib"])
    return (f"peak RSS rank 0 {figures[0]['peak_rss_mib']:.0f} MiB ({figures[0]['rss_before_mib']:.0f} MiB before), "
            f"largest rank {busiest['rank']} {busiest['peak_rss_mib']:.0f} MiB ({busiest['rss_before_mib']:.0f} MiB before)")


def _file_safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]", ".", name)


class Checkpointer(RestoreChecks):
    """Saves and restores one run's state; every method is collective (all ranks, same order).

    Args:
        trainer: the run's :class:`tf_dlrm.train.step.Trainer` (model, optimizer, step).
        spec: the run's FeatureSpec (copied into every checkpoint, checked on restore).
        model_config: the :class:`tf_dlrm.cli.model_config.ModelConfig` of the flags.
        model_identity: what checkpoints record of the model (its name or import path and its own
            config; :func:`tf_dlrm.cli.builder.model_identity`), compared on restore.
        env: this rank's place.
        reporter: progress and JSON-lines events (rank 0).
        save_path: directory of the run's checkpoints, or None (never save).
        every_steps: save every this many steps (0: only at the end).
        keep: checkpoints kept under ``save_path``.
        seed: the run's seed (data order and initial weights).
        batch_size: the global training batch size (the data position is counted in its batches).
    """

    def __init__(self, trainer, spec, model_config, model_identity: dict, env, reporter, save_path=None, every_steps=0, keep=2,
                 seed=0, batch_size=0):
        self.trainer, self.spec, self.model_config = trainer, spec, model_config
        self.model_identity = model_identity
        self.env, self.reporter = env, reporter
        self.save_path, self.every_steps, self.keep = save_path, every_steps, keep
        self.seed, self.batch_size = seed, batch_size
        self.steps_per_epoch = None
        self.data = None  # checks.data_record of the training split, when training
        self.last_saved_step = None
        self.directory_lock = None  # rank 0's lock.DirectoryLock on save_path, once training restores
        self._held = None
        self.restored = None  # the header of the checkpoint restore_for_training restored, if any
        # --keep_best / --early_stopping_patience: a callable giving the choice so far (the metric, its best
        # value and step, evaluations since) to save in each manifest; its best step's checkpoint is kept on disk.
        self.selection = None
        # --calibration: the record (tf_dlrm.calibration) fitted at the end of training, kept in the final checkpoint's
        # manifest (added to it when that step is saved already); None: none.
        self.calibration = None
        self.embedding = embedding_layer(trainer.model)
        # Dynamic tables (tf_dlrm.embedding.dynamic) have no full-table layout: checkpoint_dynamic saves their rows.
        self.dynamic = dynamic_tables.is_dynamic(self.embedding)
        self.fixed_tables = [] if self.embedding.plan is None else list(self.embedding.plan.tables)
        model_name = trainer.model.name
        self.dense = [(_relative(v.path), v) for v in trainer.mlp]
        # Optimizer slots are named after the model variable: "adam/dlrm_bottom_mlp_dense_0_kernel_momentum".
        self.optimizer_state = [
            (_relative(v.path).removeprefix(f"{model_name}_"), v) for v in trainer.dense_optimizer.variables
        ]
        # float16 training's loss scale (None otherwise): restored only when both sides have one.
        scale = getattr(trainer, "loss_scale", None)
        self.loss_scale = [] if scale is None else [("loss_scale/scale", scale.scale), ("loss_scale/good_steps", scale.good_steps)]

    @classmethod
    def from_config(cls, config, trainer, spec, model_identity: dict, env, reporter) -> "Checkpointer":
        return cls(
            trainer, spec, config.model, model_identity, env, reporter, save_path=config.save_checkpoint_path,
            every_steps=config.checkpoint_every_steps, keep=config.keep_checkpoints, seed=config.seed,
            batch_size=config.batch_size,
        )

    # ------------------------------------------------------------------ training hooks

    def restore_for_training(self, config, steps_per_epoch: int, data: dict | None = None) -> int:
        """Restores what the flags ask for (``--resume``, ``--restore_checkpoint_path``); returns the start step.

        ``data``: :func:`checks.data_record` of the training split, saved with every
        checkpoint and compared on ``--resume``.
        """
        self.steps_per_epoch, self.data = steps_per_epoch, data
        self.restart_if_all_corrupt = getattr(config, "restart_if_all_corrupt", False)
        if not (config.restore_checkpoint_path or config.resume or self.save_path):
            return 0  # the same on every rank: no collective needed
        header = self.restore(config.restore_checkpoint_path, resume=config.resume, for_training=True)
        self.restored = header
        return header["step"] if header else 0

    def _lock_directory(self):
        """Rank 0's lock on ``save_path``; on remote storage (no file locks) none, said in one line."""
        held = lock.lock_directory(self.save_path)
        if held.note:
            self.reporter.say(held.note)
        return held

    def on_step(self, step: int, epoch: int, batch_in_epoch: int) -> None:
        """The loop's hook: saves every ``every_steps`` steps."""
        if self.save_path and self.every_steps and step % self.every_steps == 0:
            self.save(step)

    def finish(self, step: int, chosen: bool = False) -> None:
        """Saves the final state unless that step is saved already.

        ``chosen``: the state is the one the run chose (``--keep_best``), possibly of an earlier step
        than later checkpoints: its checkpoint, saved now or earlier in the run, becomes the newest, and
        those of later steps (states the run rejected) are deleted.
        """
        if not self.save_path:
            return
        if step == self.last_saved_step and not chosen:
            self._add_calibration(step)
            return
        if not chosen:
            self.save(step)
            return
        final = files.join(self.save_path, store.checkpoint_name(step))
        saved = collectives.broadcast_json(self.env, self.env.is_chief and store.is_published(final), "chosen_saved")
        if not saved:
            self.save(step, chosen=True)
            return
        if self.env.is_chief:
            superseded = store.make_latest(self.save_path, final, self.keep, self.protected(), supersede=True)
            self._say_superseded(superseded, step)
        self.last_saved_step = step
        self._add_calibration(step)

    def _add_calibration(self, step: int) -> None:
        """Collective: :attr:`calibration` into the manifest of the checkpoint of ``step``, saved before it was fitted."""
        if self.calibration is None:
            return
        error = None
        if self.env.is_chief:
            directory = files.join(self.save_path, store.checkpoint_name(step))
            try:
                manifest = store.read_manifest(directory)
                if manifest.get("calibration") != self.calibration:
                    store.replace_manifest(directory, {**manifest, "calibration": self.calibration})
            except (OSError, CheckpointError) as failure:
                error = f"cannot record the calibration in checkpoint {directory}: {failure}"
        error = collectives.broadcast_json(self.env, error, "checkpoint_calibration")
        if error:
            raise CheckpointError(error)

    def _say_superseded(self, superseded: list[str], step: int) -> None:
        if superseded:
            self.reporter.say(f"kept checkpoint {store.checkpoint_name(step)} (the chosen state) as the newest; deleted the "
                              f"later ones, of rejected states: {', '.join(files.basename(p) for p in superseded)}")

    def protected(self) -> tuple[str, ...]:
        """The checkpoint of the selection's best step, kept against retention while the run lasts."""
        record = self.selection() if self.selection else None
        if not record or record.get("best_step") is None:
            return ()
        return (files.join(self.save_path, store.checkpoint_name(record["best_step"])),)

    # ------------------------------------------------------------------ save

    def save(self, step: int, chosen: bool = False, latest: bool = True) -> str:
        """Every rank writes its slices, rank 0 the rest; publishes atomically and prunes; returns the path.

        ``chosen``: see :meth:`finish`. ``latest=False``: an earlier state saved beside the newest (the
        best one, when a run is interrupted), which ``latest`` keeps naming.
        """
        started = time.time()
        # --hot_row_sync_every > 1: the saved hot rows are the merged ones, the same on every rank.
        synchronize = getattr(self.trainer, "synchronize_hot_rows", None)
        if synchronize is not None:
            synchronize()  # collective: every rank saves
        delay = float(os.environ.get(DELAY_ENV, "0") or 0)
        error, temporary, final, files = None, None, None, {}
        with MemoryWatch() as memory:
            if self.env.is_chief:
                # Non-finite weights are never saved: they would replace (through retention) the good ones.
                bad = non_finite_arrays((name, variable.numpy()) for name, variable in self.dense + self.optimizer_state)
                if bad:
                    error = self._refusal(step, f"{', '.join(bad)} hold NaN or inf")
            if self.env.is_chief and error is None:
                try:
                    temporary, final = store.prepare(self.save_path, step)
                except (OSError, CheckpointError) as failure:
                    error = f"cannot save a checkpoint under {self.save_path}: {failure}"
            root = collectives.broadcast_json(self.env, temporary if error is None else None, "checkpoint_root")
            records, piece_error = [], None
            if root is not None and self.fixed_tables:
                arrays = [("table", table, None, False) for table in range(len(self.fixed_tables))]
                arrays += embedding_state.arrays(self.trainer, len(self.fixed_tables))
                records, piece_error = slices.save_pieces(self.embedding, self.env.rank, root, arrays, files,
                                                          delay if self.env.is_chief else 0.0)
            pieces = collectives.allgather_json(self.env, {"records": records, "files": files, "error": piece_error}, "checkpoint_pieces")
            failed = next((f"rank {rank}: {p['error']}" for rank, p in enumerate(pieces) if p["error"]), None)
            if failed and error is None:
                error = self._refusal(step, failed.split(": ", 1)[1]) if "NaN or inf" in failed else failed
            dynamic_record = None
            if self.dynamic:  # collective; rank 0's error or the rows' own
                shared_root = collectives.broadcast_json(self.env, temporary if self.env.is_chief and error is None else None,
                                             "dynamic_checkpoint_root")
                dynamic_record, dynamic_error = dynamic_tables.save(self.trainer, self.env, shared_root, files,
                                                                    lambda what: self._refusal(step, what))
                error = error or dynamic_error
                if delay and self.env.is_chief:
                    time.sleep(delay)
            if self.env.is_chief and error is None:
                try:
                    all_records = [r for p in pieces for r in p["records"]]
                    for p in pieces:
                        files.update(p["files"])
                    tables = slices.manifest_entries(all_records, self.fixed_tables, "table")
                    state_entries = embedding_state.entries(self.trainer, all_records, self.fixed_tables)
                    self._write_rest(temporary, step, files, tables, state_entries, dynamic_record)
                    superseded = store.publish(self.save_path, temporary, final, self.keep, self.protected(),
                                               supersede=chosen, latest=latest)
                    self._say_superseded(superseded, step)
                except OSError as failure:
                    published = store.is_published(final) if temporary == final else (
                        os.path.isdir(final) and not os.path.exists(temporary))
                    error = f"{'published' if published else 'cannot complete'} checkpoint {final}, then failed: {failure}"
            if self.env.is_chief and error is not None and temporary is not None:
                store.discard(temporary, final)
        status = collectives.broadcast_json(self.env, {"error": error, "path": final}, "checkpoint_save_status")
        figures = memory.gathered(self.env)
        if status["error"]:
            raise CheckpointError(status["error"])
        self.last_saved_step = step
        seconds = time.time() - started
        size = sum(entry["bytes"] for entry in files.values())  # rank 0 holds every rank's records
        self.reporter.say(
            f"saved checkpoint {status['path']} (step {step}, {size / 2**20:.1f} MiB, slices written by "
            f"{self.env.world_size} rank(s)) in {seconds:.2f} s; {_memory_line(figures)}"
        )
        self.reporter.event("checkpoint_saved", path=status["path"], step=step, seconds=seconds, bytes=size, memory=figures)
        return status["path"]

    def _refusal(self, step: int, what: str) -> str:
        kept = latest_checkpoint(self.save_path) if self.save_path else None
        return (
            f"refusing to save a checkpoint at step {step}: the weights {what} (the run diverged); "
            f"the last good checkpoint is kept: {kept or 'none saved yet'}"
        )

    def _position(self, step: int) -> dict:
        epoch, batch = divmod(step, self.steps_per_epoch) if self.steps_per_epoch else (None, None)
        return {"epoch": epoch, "batch": batch, "steps_per_epoch": self.steps_per_epoch, "batch_size": self.batch_size}

    def _write_rest(self, root: str, step: int, files: dict, tables: list, state_entries: list, dynamic_record) -> None:
        dense, state, scale = [], [], []
        for entries, variables, folder in (
            (dense, self.dense, "dense"), (state, self.optimizer_state, "optimizer"), (scale, self.loss_scale, "optimizer")
        ):
            for name, variable in variables:
                file = f"{folder}/{_file_safe(name)}.npy"
                files[file] = store.write_npy(root, file, variable.numpy())
                entries.append({"name": name, "file": file})
        # A library model's checkpoint (tf_dlrm.checkpoint.model_checkpoint) has no run around it: no spec,
        # no flags; its tables and dense weights are checked by shape and name on restore.
        model = model_record(self.spec, self.model_config, self.model_identity) if self.spec is not None else None
        selection = self.selection() if self.selection else None
        config = getattr(self.trainer, "config", None)
        optimizer_record = config.record() if config is not None else {"name": None, "embedding_optimizer": None}
        if self.spec is not None:
            files[MODEL_CONFIG] = store.write_text(root, MODEL_CONFIG, json.dumps(
                {"model": model, "optimizer": optimizer_record, "seed": self.seed}, indent=1))
            files[SPEC_COPY] = store.write_text(root, SPEC_COPY, yaml.safe_dump(self.spec.to_dict(), sort_keys=False))
        position = self._position(step)
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "step": int(step),
            "position": position,
            "data": self.data or {},
            "learning_rate": float(self.trainer.learning_rate.numpy()) if hasattr(self.trainer, "learning_rate") else None,
            "rng": {
                "seed": self.seed,
                "data_order": "numpy.random.default_rng([seed, epoch]).permutation(batches of the epoch)",
                "epoch": position["epoch"],
                "batch": position["batch"],
                "note": "training draws no other random numbers",
            },
            "saved_world_size": self.env.world_size,
            "saved_plan": None if self.embedding.plan is None else self.embedding.plan.to_dict(),
            "model": model,
            "optimizer": optimizer_record,
            "tables": tables,
            "dense": dense,
            "optimizer_state": state,
            "loss_scale": scale,
            "embedding_state": state_entries,
            **({"selection": selection} if selection else {}),
            **({"calibration": self.calibration} if self.calibration else {}),
            **({dynamic_tables.MANIFEST_KEY: dynamic_record} if dynamic_record else {}),
            "files": files,
        }
        store.write_manifest(root, manifest)  # last: a directory without one is never taken for a checkpoint

    # ------------------------------------------------------------------ restore

    def restore(self, restore_path: str | None, resume: bool = False, for_training: bool = False, required: bool = False,
                own: bool = False) -> dict | None:
        """Loads a checkpoint into the trainer on every rank; returns its header (None: nothing to restore).

        With ``resume`` the latest checkpoint under ``save_path`` wins, then ``restore_path``.
        ``for_training`` also restores the optimizer state and checks the data position. ``own``:
        ``restore_path`` is a checkpoint this run saved (the best state, read back at the end).
        """
        started = time.time()
        # Rank 0 holds the chosen checkpoint against retention until every rank has read it.
        with MemoryWatch() as memory, contextlib.ExitStack() as self._held:
            header = None
            if self.env.is_chief:
                try:
                    # Held until this process exits; taken once the checks pass when the directory is new, so
                    # that a refused run leaves nothing behind.
                    owned = for_training and self.save_path and self.directory_lock is None
                    if owned and files.isdir(self.save_path):
                        self.directory_lock = self._lock_directory()
                    header = self._check(restore_path, resume, for_training, required, own)
                    if owned and self.directory_lock is None:
                        self.directory_lock = self._lock_directory()
                except (ValueError, TypeError, KeyError, OSError) as failure:  # CheckpointError is a ValueError
                    # Rank 0 must not fail alone: every rank raises the same error below.
                    header = {"error": str(failure) if isinstance(failure, CheckpointError) else f"checkpoint {restore_path or self.save_path} is malformed: {failure!r}"}
            header = collectives.broadcast_json(self.env, header, "checkpoint_restore_header")
            for line in header.get("skipped", []):
                self.reporter.say(line)
            if "error" in header:
                raise CheckpointError(header["error"])
            if header["path"] is None:
                if header["note"]:
                    self.reporter.say(header["note"])
                return None
            directory = header["path"]
            widths, cardinalities = self._table_shapes()
            # Each rank reads the column ranges it owns now (no collective; rank 0 verified every file).
            for table, rows in enumerate(cardinalities):
                saved = slices.open_slices(directory, header["tables"][table], rows, widths[table])
                slices.restore_pieces(self.embedding, table, saved)
            if for_training:
                embedding_state.restore(self.trainer, directory, header["embedding_state"], cardinalities, widths)
            if self.dynamic:
                dynamic_tables.restore(self.trainer, self.env, directory, header["dynamic"], for_training)
            variables = [v for _, v in self.dense]
            if for_training:
                variables += [v for _, v in self.optimizer_state] + ([v for _, v in self.loss_scale] if header["loss_scale"] else [])
            if self.env.is_chief:
                entries = header["dense"] + (header["optimizer_state"] + header["loss_scale"] if for_training else [])
                for file, variable in zip(entries, variables):
                    variable.assign(load_array(directory, file, variable.shape, variable.dtype))
            collectives.broadcast_variables(self.env, variables)
            self.trainer.step.assign(header["step"])
            if hasattr(self.trainer, "learning_rate") and header["learning_rate"] is not None:
                self.trainer.learning_rate.assign(header["learning_rate"])
            if hasattr(self.trainer, "hot_rows_written"):
                self.trainer.hot_rows_written()  # the restored replicas are the merged state
        figures = memory.gathered(self.env)
        seconds = time.time() - started
        if self._is_own(directory):
            self.last_saved_step = header["step"]
        self.reporter.say(
            f"restored checkpoint {directory} (step {header['step']}) in {seconds:.2f} s on {self.env.world_size} rank(s); "
            f"{_memory_line(figures)}"
        )
        self.reporter.event("checkpoint_restored", path=directory, step=header["step"], seconds=seconds, memory=figures)
        return header
