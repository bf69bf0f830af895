"""Checkpoint directories are owned: one training run writes a directory (a second is refused, naming
the first), a reader keeps the checkpoint it reads from retention, and a checkpoint deleted as it is
chosen is skipped as deleted, never moved aside as corrupt. ``flock`` locks belong to open file
descriptions, so two locks taken in this one process conflict as two processes' would."""

from __future__ import annotations

import os

import pytest

from checkpoint_files import write_checkpoint  # noqa: E402
from tf_dlrm.checkpoint import lock, store
from tf_dlrm.checkpoint.checks import newest_intact


def test_a_second_writer_is_refused_naming_the_first(tmp_path):
    first = lock.DirectoryLock(str(tmp_path))
    with pytest.raises(store.CheckpointError, match=rf"--save_checkpoint_path={tmp_path} is in use by another training "
                                                     rf"run \(pid {os.getpid()} on host \S+ since \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d \S*: "):
        lock.DirectoryLock(str(tmp_path))
    first.release()
    lock.DirectoryLock(str(tmp_path)).release()  # free again once the holder is gone


def test_retention_keeps_what_a_reader_holds_and_deletes_it_later(tmp_path):
    save = str(tmp_path)
    oldest = write_checkpoint(save, 2)
    with lock.reading(oldest):
        write_checkpoint(save, 4)
        store.retain(save, keep=1)
        assert [step for step, _ in store.list_checkpoints(save)] == [2, 4]  # held: kept
        assert os.path.isfile(os.path.join(oldest, "tables", "table_000.npy"))
    store.retain(save, keep=1)
    assert [step for step, _ in store.list_checkpoints(save)] == [4]


def test_a_checkpoint_deleted_before_it_is_held_is_skipped_as_deleted(tmp_path, monkeypatch):
    import contextlib

    save = str(tmp_path)
    older = write_checkpoint(save, 2)
    newest = write_checkpoint(save, 4)
    real = lock.reading

    def deleted_first(path):
        if path == newest:  # retention of the training run wins the race for the newest one
            os.rename(path, os.path.join(save, f".{os.path.basename(path)}.deleting"))
        return real(path)

    monkeypatch.setattr(lock, "reading", deleted_first)
    with contextlib.ExitStack() as held:
        chosen, skipped = newest_intact(save, move_aside=True, held=held)
    assert chosen == older
    assert skipped == [f"skipped checkpoint {newest}: checkpoint {newest} was deleted while it was being opened "
                       "(by its run's retention)"]
    assert not os.path.exists(newest + ".corrupt")


def test_a_corrupt_checkpoint_moves_aside_past_a_taken_name(tmp_path):
    save = str(tmp_path)
    older = write_checkpoint(save, 2)
    newest = write_checkpoint(save, 4)
    os.makedirs(newest + ".corrupt")  # left by an earlier run
    with open(os.path.join(newest, "tables", "table_000.npy"), "r+b") as handle:
        handle.seek(-1, os.SEEK_END)
        handle.write(b"\x00")
    chosen, skipped = newest_intact(save, move_aside=True)
    assert chosen == older
    assert skipped[0].endswith(f"moved it aside to {newest}.corrupt-2") and os.path.isdir(newest + ".corrupt-2")
