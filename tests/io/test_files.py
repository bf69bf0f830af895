"""Paths that may be local or remote (tf_dlrm/io/files.py), tested against TensorFlow's in-memory ``ram://``.

A local file and its ``ram://`` copy read back the same bytes through every call (ranged reads from
several threads included); TensorFlow's errors come out as the built-in ones; a checkpoint saved to
remote storage is never visible half-written (a failure at each step of the save is simulated), and
retention and a failed export leave no checkpoint or output that looks complete.
"""

from __future__ import annotations

import json
import os
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tf_dlrm.checkpoint import lock, store  # noqa: E402
from tf_dlrm.io import files, publish  # noqa: E402


@pytest.fixture
def remote():
    """A fresh ``ram://`` directory (ram:// is one per process: a unique name keeps tests apart)."""
    path = f"ram://test_files_{uuid.uuid4().hex}"
    files.makedirs(path)
    yield path
    files.rmtree(path)


def test_names_of_remote_paths_keep_their_scheme_and_bucket():
    assert files.is_remote("gs://bucket/a") and files.is_remote("ram://x") and not files.is_remote("/tmp/a")
    assert not files.is_remote("relative/dir") and files.scheme("S3://b/k") == "s3"
    assert files.join("gs://bucket/a", "b", "c.bin") == "gs://bucket/a/b/c.bin"
    assert files.normalize("gs://bucket/a/./b/../c") == "gs://bucket/a/c"
    assert files.dirname("gs://bucket/a/c") == "gs://bucket/a" and files.basename("gs://bucket/a/c/") == "c"
    assert files.absolute("ram://a//b/") == "ram://a/b" and files.is_absolute("ram://a")
    assert files.inside("gs://b/run/ckpt", "gs://b/run") and not files.inside("gs://b/runs", "gs://b/run")
    # Local paths: the operating system's functions, unchanged.
    assert files.join("a", "b") == os.path.join("a", "b") and files.absolute("a/../b") == os.path.abspath("b")


def test_local_and_remote_files_give_the_same_bytes(tmp_path, remote):
    data = np.random.default_rng(3).integers(0, 256, size=300_001, dtype=np.uint8).tobytes()
    paths = [str(tmp_path / "sub" / "blob.bin"), files.join(remote, "sub", "blob.bin")]
    for path in paths:
        files.makedirs(files.dirname(path))
        with files.open_file(path, "wb") as handle:
            handle.write(data[:100_000])
            handle.write(memoryview(data[100_000:]))  # as np.save and the checkpoint slices write
            files.sync(handle)
    for path in paths:
        assert files.exists(path) and files.isfile(path) and not files.isdir(path)
        assert files.isdir(files.dirname(path)) and files.listdir(files.dirname(path)) == ["blob.bin"]
        assert files.getsize(path) == len(data)
        assert files.glob(files.join(files.dirname(path), "b*.bin")) == [path]
        with files.open_file(path, "rb") as handle:
            assert handle.read() == data
            handle.seek(1000)
            np.testing.assert_array_equal(files.read_array(handle, np.uint8, 7), np.frombuffer(data[1000:1007], np.uint8))
        ranged = files.RandomAccessFile(path)
        offsets = list(range(0, len(data), 9_973)) + [len(data) - 5]
        # Several threads at once, as the dataset reader's parallel reads.
        with ThreadPoolExecutor(4) as pool:
            pieces = list(pool.map(lambda offset: ranged.read(4096, offset), offsets))
        assert pieces == [data[offset:offset + 4096] for offset in offsets]
        assert ranged.size() == len(data)
        ranged.close()
    local_text, remote_text = str(tmp_path / "t.json"), files.join(remote, "t.json")
    for path in (local_text, remote_text):
        with files.open_file(path, "w", encoding="utf-8") as handle:
            json.dump({"é": 1}, handle)
    with files.open_file(local_text, encoding="utf-8") as a, files.open_file(remote_text, encoding="utf-8") as b:
        assert a.read() == b.read()
    # "w" replaces what a file held (ram:// itself would append).
    with files.open_file(remote_text, "w") as handle:
        handle.write("{}")
    with files.open_file(remote_text) as handle:
        assert handle.read() == "{}"


def test_renames_removals_and_trees_on_remote_storage(remote):
    source = files.join(remote, "tree")
    for name in ("manifest.json", "tables/t.npy", "dense/d.npy"):
        files.makedirs(files.dirname(files.join(source, name)))
        with files.open_file(files.join(source, name), "w") as handle:
            handle.write(name)
    files.move_tree(source, files.join(remote, "moved"), first=("manifest.json",))
    assert files.walk_files(files.join(remote, "moved")) == ["dense/d.npy", "manifest.json", "tables/t.npy"]
    assert files.walk_files(source) == []
    with pytest.raises(FileExistsError):
        files.move_tree(files.join(remote, "moved"), files.join(remote, "moved"))
    with pytest.raises(FileExistsError):
        files.rename(files.join(remote, "moved", "manifest.json"), files.join(remote, "moved", "dense", "d.npy"))
    files.rename(files.join(remote, "moved", "manifest.json"), files.join(remote, "moved", "dense", "d.npy"), overwrite=True)
    with files.open_file(files.join(remote, "moved", "dense", "d.npy")) as handle:
        assert handle.read() == "manifest.json"
    files.rmtree(files.join(remote, "moved"))
    assert not files.isfile(files.join(remote, "moved", "tables", "t.npy"))
    assert "moved" not in files.listdir(remote)


def test_tensorflow_errors_come_out_as_the_builtin_ones(remote):
    with pytest.raises(FileNotFoundError):
        files.open_file(files.join(remote, "missing.bin"), "rb")
    with pytest.raises(FileNotFoundError):
        files.listdir(files.join(remote, "missing"))
    with pytest.raises(FileNotFoundError):
        files.RandomAccessFile(files.join(remote, "missing.bin"))
    if "s3" not in _schemes():
        with pytest.raises(OSError, match="no filesystem for 's3://'.*tensorflow-io"):
            files.exists("s3://bucket/key")


def _schemes() -> set:
    schemes = set()
    for scheme in ("s3",):
        try:
            tf.io.gfile.exists(f"{scheme}://bucket/key")
            schemes.add(scheme)
        except tf.errors.UnimplementedError:
            pass
        except tf.errors.OpError:
            schemes.add(scheme)  # a filesystem answered (no network here)
    return schemes


def _save_in_place(save_path: str, step: int, fail_at: str | None = None) -> tuple[str, str]:
    """The steps of a checkpoint save (prepare, files, manifest, publish), failing at ``fail_at``."""
    temporary, final = store.prepare(save_path, step)
    file_entries = {"model_config.json": store.write_text(temporary, "model_config.json", "{}")}
    if fail_at == "files":
        raise OSError("simulated: the store went away while the tables were written")
    file_entries["tables/table_000.npy"] = store.write_npy(temporary, "tables/table_000.npy", np.ones((4, 2), np.float32))
    file_entries["feature_spec.yaml"] = store.write_text(temporary, "feature_spec.yaml", "feature_spec: {}\n")
    manifest = {"format": store.FORMAT, "version": store.VERSION, "step": step, "position": {}, "model": {},
                "optimizer": {}, "files": file_entries, "tables": [], "dense": [], "optimizer_state": []}
    store.write_manifest(temporary, manifest)
    store.publish(save_path, temporary, final, keep=2)
    return temporary, final


def test_a_remote_checkpoint_is_never_visible_half_written(remote, monkeypatch):
    save_path = files.join(remote, "ckpt")
    _, first = _save_in_place(save_path, 2)
    assert store.latest_checkpoint(save_path) == first
    store.verify_files(first, store.read_manifest(first))
    # Remote saves write the final directory in place: no hidden temporary, no directory rename.
    assert sorted(files.listdir(save_path)) == ["ckpt-00000002", "latest"]

    # A failure while the tables are written: the directory exists, holds no manifest, is never listed.
    with pytest.raises(OSError, match="simulated"):
        _save_in_place(save_path, 4, fail_at="files")
    assert "ckpt-00000004" in files.listdir(save_path) and not store.is_published(files.join(save_path, "ckpt-00000004"))
    assert store.latest_checkpoint(save_path) == first
    with pytest.raises(store.CheckpointError, match="not a complete checkpoint"):
        store.read_manifest(files.join(save_path, "ckpt-00000004"))

    # A failure while the manifest is published (its write is whole, its rename fails): still not listed.
    real_rename = files.rename

    def failing_rename(source, target, overwrite=False):
        if target.endswith(store.MANIFEST):
            raise OSError("simulated: the manifest's rename failed")
        real_rename(source, target, overwrite)

    monkeypatch.setattr(files, "rename", failing_rename)
    with pytest.raises(OSError, match="simulated"):
        _save_in_place(save_path, 6)
    monkeypatch.setattr(files, "rename", real_rename)
    assert files.isfile(files.join(save_path, "ckpt-00000006", store.MANIFEST + ".partial"))
    assert store.latest_checkpoint(save_path) == first and [s for s, _ in store.list_checkpoints(save_path)] == [2]

    # The failed save's directory is discarded by the caller; the next save clears what a killed one left.
    store.discard(files.join(save_path, "ckpt-00000006"), files.join(save_path, "ckpt-00000006"))
    _, fourth = _save_in_place(save_path, 4)
    assert sorted(files.listdir(save_path)) == ["ckpt-00000002", "ckpt-00000004", "latest"]
    store.verify_files(fourth, store.read_manifest(fourth))
    # discard never removes a published checkpoint (a remote save's directory is its final one).
    store.discard(fourth, fourth)
    assert store.is_published(fourth)


def test_remote_retention_removes_the_manifest_first(remote, monkeypatch):
    save_path = files.join(remote, "ckpt")
    _save_in_place(save_path, 1)
    # Deleting the files fails half-way: the old checkpoint no longer counts, and the next save clears it.
    monkeypatch.setattr(files, "rmtree", lambda path: None)
    _save_in_place(save_path, 2)
    _save_in_place(save_path, 3)
    assert [s for s, _ in store.list_checkpoints(save_path)] == [2, 3]
    assert "ckpt-00000001" in files.listdir(save_path)
    monkeypatch.undo()
    _save_in_place(save_path, 4)
    assert sorted(files.listdir(save_path)) == ["ckpt-00000003", "ckpt-00000004", "latest"]
    with files.open_file(files.join(save_path, store.LATEST)) as handle:
        assert handle.read() == "ckpt-00000004\n"


def test_remote_directories_are_not_locked_and_say_so(remote, tmp_path):
    held = lock.lock_directory(files.join(remote, "ckpt"))
    assert isinstance(held, lock.Unlocked) and "no file locks" in held.note
    held.release()
    local = lock.lock_directory(str(tmp_path))
    assert isinstance(local, lock.DirectoryLock) and local.note is None
    local.release()
    with pytest.raises(lock.CheckpointVanished):
        with lock.reading(files.join(remote, "ckpt", "ckpt-00000001")):
            pass


def test_a_remote_output_is_complete_only_with_its_manifest(remote):
    output = files.join(remote, "export")
    with pytest.raises(RuntimeError, match="simulated"):
        with publish.staged_output(output, "--saved_model_path", "tf_dlrm export") as workspace:
            assert workspace == output  # written in place: no directory rename on remote storage
            with files.open_file(files.join(workspace, "saved_model.pb"), "wb") as handle:
                handle.write(b"half")
            raise RuntimeError("simulated failure mid-export")
    assert not files.exists(files.join(output, "saved_model.pb"))
    with publish.staged_output(output, "--saved_model_path", "tf_dlrm export") as workspace:
        with files.open_file(files.join(workspace, "saved_model.pb"), "wb") as handle:
            handle.write(b"whole")
    with files.open_file(files.join(output, publish.MANIFEST)) as handle:
        assert json.load(handle) == {"writer": "tf_dlrm export", "files": ["saved_model.pb"]}
    # A foreign file makes a rewrite refuse, as locally.
    with files.open_file(files.join(output, "notes.txt"), "w") as handle:
        handle.write("mine")
    with pytest.raises(publish.OutputDirectoryError, match="notes.txt"):
        publish.check_replaceable(output, "--saved_model_path", "tf_dlrm export")


def _copy_up(local: str, target: str) -> None:
    for root, _, names in os.walk(local):
        relative = os.path.relpath(root, local)
        for name in names:
            path = files.join(target, *([] if relative == "." else [relative]), name)
            files.makedirs(files.dirname(path))
            tf.io.gfile.copy(os.path.join(root, name), path)


def _same_batches(readers) -> int:
    batches = 0
    for (a_features, a_label), (b_features, b_label) in zip(readers[0].dataset(), readers[1].dataset()):
        assert list(a_features) == list(b_features)
        np.testing.assert_array_equal(a_label.numpy(), b_label.numpy())
        for name in a_features:
            np.testing.assert_array_equal(a_features[name].numpy(), b_features[name].numpy(), err_msg=name)
        batches += 1
    return batches


def test_the_dataset_readers_read_the_same_batches_from_remote_storage(tmp_path, remote):
    from tf_dlrm.data.reader import SplitBinaryReader
    from tf_dlrm.data.split_tfrecords import _Input
    from tf_dlrm.data.synthetic import generate
    from tf_dlrm.data.to_split_tfrecords import convert
    from tf_dlrm.spec.feature_spec import FeatureSpec

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = FeatureSpec.load(os.path.join(repo, "feature_specs", "synthetic_small.yaml"), check_files=False)
    local, records = str(tmp_path / "data"), str(tmp_path / "records")
    generate(spec, local, num_train_samples=600, num_valid_samples=10, seed=5)
    convert(local, records, prebatch_size=64, prebatches_per_file=3)
    _copy_up(local, files.join(remote, "data"))
    _copy_up(records, files.join(remote, "records"))
    modes = {name: "global" if index in (0, 2) else "local" for index, name in enumerate(spec.categorical_features)}
    readers = [SplitBinaryReader(FeatureSpec.load(files.join(base, "feature_spec.yaml")), "train", 128, rank=1, world_size=2,
                                 input_modes=modes, last_batch="pad", parallel_reads=3)
               for base in (local, files.join(remote, "data"))]
    assert readers[0].num_samples == readers[1].num_samples == 600
    assert _same_batches(readers) == 5
    for reader in readers:
        reader.close()
    # split_tfrecords: each input directory's format.json and data_<k>.tfrecords files, found and read there.
    inputs = [_Input(files.join(base, "train", "categorical_2")) for base in (records, files.join(remote, "records"))]
    assert [files.basename(p) for p in inputs[1].files] == [f"data_{k}.tfrecords" for k in range(4)]  # 10 pre-batches, 3 a file
    assert inputs[1].files[0].startswith("ram://") and inputs[0].dtype == inputs[1].dtype
    pairs = list(zip(inputs[0].prebatches(), inputs[1].prebatches()))
    assert len(pairs) == 10
    for a, b in pairs:
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_dynamic_table_rank_files_are_the_same_bytes_on_remote_storage(tmp_path, remote):
    """A dynamic-table checkpoint's rank file (an .npz: zip writing seeks back, which a remote file
    being written cannot) is written whole to remote storage and reads back the same arrays."""
    from tf_dlrm.checkpoint import dynamic_tables

    arrays = {"t0_keys": np.arange(5, dtype=np.int64) * 7, "t0_values": np.linspace(0, 1, 15, dtype=np.float32).reshape(5, 3),
              "evictions": np.array([2], np.int64)}
    local, far = str(tmp_path / "dynamic_rank0.npz"), files.join(remote, "dynamic", "dynamic_rank0.npz")
    for path in (local, far):
        files.makedirs(files.dirname(path))
        dynamic_tables._write_rank_file(path, arrays)
    with open(local, "rb") as a, files.open_file(far, "rb") as b:
        assert a.read() == b.read()
    loaded = dynamic_tables._load_rank_file(far)
    assert sorted(loaded) == sorted(arrays)
    for name, values in arrays.items():
        np.testing.assert_array_equal(loaded[name], values)


def test_a_corrupt_remote_checkpoint_is_skipped_and_moved_aside(remote):
    from tf_dlrm.checkpoint import checks

    save_path = files.join(remote, "ckpt")
    _, good = _save_in_place(save_path, 2)
    _, bad = _save_in_place(save_path, 4)
    with files.open_file(files.join(bad, "tables/table_000.npy"), "wb") as handle:
        handle.write(b"\x00" * files.getsize(files.join(good, "tables/table_000.npy")))  # same size, other bytes
    chosen, skipped = checks.newest_intact(save_path, move_aside=True)
    assert chosen == good and len(skipped) == 1 and "sha256" in skipped[0] and "ckpt-00000004.corrupt" in skipped[0]
    assert sorted(files.listdir(save_path)) == ["ckpt-00000002", "ckpt-00000004.corrupt", "latest"]
    assert files.walk_files(files.join(save_path, "ckpt-00000004.corrupt")) == [
        "feature_spec.yaml", "manifest.json", "model_config.json", "tables/table_000.npy"]
