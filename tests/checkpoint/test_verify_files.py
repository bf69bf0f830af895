"""verify_files hashes on several threads and still names the first bad file; a resume hashes once."""

from __future__ import annotations

import os

import pytest

from checkpoint_files import write_checkpoint  # noqa: E402
from tf_dlrm.checkpoint import store
from tf_dlrm.checkpoint.checks import RestoreChecks


def flip_a_byte(path: str) -> None:
    with open(path, "r+b") as handle:
        handle.seek(os.path.getsize(path) - 7)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_every_file_is_hashed_and_the_first_bad_one_in_manifest_order_is_named(tmp_path, threads):
    directory = write_checkpoint(str(tmp_path), 3)
    manifest = store.read_manifest(directory)
    store.verify_files(directory, manifest, threads=threads)
    # Two corrupt files (the size unchanged): the error must name the earlier one whichever thread
    # finishes first, and the last file must be hashed too (a pool that dropped work would pass it).
    flip_a_byte(os.path.join(directory, "tables/table_005.npy"))
    with pytest.raises(store.CheckpointError, match=r"file tables/table_005\.npy fails its sha256 checksum"):
        store.verify_files(directory, manifest, threads=threads)
    flip_a_byte(os.path.join(directory, "tables/table_002.npy"))
    for _ in range(5):
        with pytest.raises(store.CheckpointError, match=r"file tables/table_002\.npy fails its sha256 checksum"):
            store.verify_files(directory, manifest, threads=threads)


def test_a_wrong_size_is_refused_before_any_checksum(tmp_path, monkeypatch):
    directory = write_checkpoint(str(tmp_path), 3)
    with open(os.path.join(directory, "tables/table_004.npy"), "ab") as handle:
        handle.write(b"x")
    hashed = []
    monkeypatch.setattr(store, "_sha256", lambda path: hashed.append(path) or "0" * 64)
    with pytest.raises(store.CheckpointError, match=r"file tables/table_004\.npy has \d+ bytes but the manifest says"):
        store.verify_files(directory, store.read_manifest(directory))
    assert hashed == []


class _Choice(RestoreChecks):
    def __init__(self, save_path: str):
        self.save_path = save_path


def test_resume_hashes_the_chosen_checkpoint_once(tmp_path, monkeypatch):
    write_checkpoint(str(tmp_path), 2)
    newest = write_checkpoint(str(tmp_path), 4)
    hashed = []
    real = store._sha256
    monkeypatch.setattr(store, "_sha256", lambda path: hashed.append(path) or real(path))
    directory, skipped, verified = _Choice(str(tmp_path))._choose(None, resume=True, for_training=True)
    assert (directory, skipped, verified) == (newest, [], True)
    assert len(hashed) == len(store.read_manifest(newest)["files"])  # each file once
    # An explicit --restore_checkpoint_path is not verified by the choice: _check verifies it.
    directory, _, verified = _Choice(None)._choose(newest, resume=False, for_training=False)
    assert (directory, verified) == (newest, False)
