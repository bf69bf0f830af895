"""Checkpoints: what a save holds, restoring on other world sizes and plans, and refusing bad ones.

Saved with ``-np 2`` (column-wise), restored with ``-np 1`` (auto plan) and ``-np 3`` (table-wise):
validation AUC / logloss and the predictions of a fixed batch agree within 1e-6 (only the batch
split of the forward pass differs). Corrupt, truncated, unsafe or mismatching checkpoints are
refused with a message naming the file, flag or feature.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from checkpoint_runs import EVERY, STEPS, ckpt, single, straight, table_wise
from tf_dlrm.checkpoint import slices as checkpoint_slices, store as checkpoint_store

pytestmark = pytest.mark.multirank


def test_a_checkpoint_holds_the_whole_state(tmp_path_factory):
    run = straight(tmp_path_factory)
    directory = ckpt(run["save"], STEPS)
    manifest = checkpoint_store.read_manifest(directory)
    checkpoint_store.verify_files(directory, manifest)
    assert manifest["step"] == STEPS
    # 8 batches per epoch: step 10 resumes at epoch 1, batch 2.
    assert manifest["position"] == {"epoch": 1, "batch": 2, "steps_per_epoch": 8, "batch_size": 192}
    assert manifest["rng"]["seed"] == 7 and manifest["saved_world_size"] == 2
    assert [t["rows"] for t in manifest["tables"]] == [3, 16, 120, 600, 1500, 2048, 3500, 5000]
    names = [s["name"] for s in manifest["optimizer_state"]]
    assert names[:2] == ["iteration", "learning_rate"]
    assert "bottom_mlp_dense_0_kernel_momentum" in names and "top_mlp_dense_1_bias_velocity" in names
    assert {"model_config.json", "feature_spec.yaml"} <= set(manifest["files"])
    # Row-wise Adagrad: one accumulator per row of every table, in full-table layout.
    state = {entry["name"]: entry["file"] for entry in manifest["embedding_state"]}
    # And the frequency regularizer's row counts (main.py's default --embedding_min_count, --embedding_frequency_l2).
    assert sorted(state) == [f"accumulator/table_{t:03d}" for t in range(8)] + [f"row_count/table_{t:03d}" for t in range(8)]
    accumulator = np.load(os.path.join(directory, state["accumulator/table_007"]), allow_pickle=False)
    assert accumulator.shape == (5000, 1) and (accumulator >= 0.1).all() and (accumulator > 0.1).any()
    iteration = np.load(os.path.join(directory, "optimizer", "iteration.npy"), allow_pickle=False)
    assert int(iteration) == STEPS
    with open(os.path.join(run["save"], "latest")) as handle:
        assert handle.read().strip() == f"ckpt-{STEPS:08d}"
    assert [step for step, _ in checkpoint_store.list_checkpoints(run["save"])] == [EVERY, STEPS]


def test_tables_are_saved_as_the_owners_slices(tmp_path_factory):
    """-np 2 column-wise: each model-parallel table is two column-slice files, written by their owners,
    that join into the whole table (the first rows match the sharding-independent initial ones);
    replicated tables are one whole file; row-wise state is one [rows, 1] file per table."""
    from tf_dlrm.embedding.table_config import DEFAULT_INIT_BOUND
    from tf_dlrm.embedding.table_init import initial_table_slice

    run = straight(tmp_path_factory)
    directory = ckpt(run["save"], STEPS)
    manifest = checkpoint_store.read_manifest(directory)
    assert manifest["version"] == 2
    entry = manifest["tables"][7]
    assert [s["columns"] for s in entry["slices"]] == [[0, 4], [4, 8]] and "file" not in entry
    assert [s["file"] for s in entry["slices"]] == ["tables/table_007.cols_0-4.npy", "tables/table_007.cols_4-8.npy"]
    parts = [np.load(os.path.join(directory, s["file"]), allow_pickle=False) for s in entry["slices"]]
    assert [p.shape for p in parts] == [(5000, 4), (5000, 4)]
    saved = np.concatenate(parts, axis=1)
    np.testing.assert_array_equal(checkpoint_slices.read_table(directory, entry), saved)
    initial = initial_table_slice(7, 7, 5000, 8, init_bound=DEFAULT_INIT_BOUND)  # main.py's --embedding_init
    # Training touched few rows: most rows still equal the (sharding-independent) initial table.
    assert np.mean(np.all(saved == initial, axis=1)) > 0.5
    # Replicated tables (0-4 here) are written whole, once.
    assert manifest["tables"][0]["file"] == "tables/table_000.npy" and len(manifest["tables"][0]["slices"]) == 1
    assert not [name for name in manifest["files"] if name.startswith("tables/table_000.cols")]


def test_a_version_1_checkpoint_of_full_tables_still_restores(tmp_path_factory, tmp_path):
    """The layout before sharded saves: one full-table file per table and per state. Rewritten from the
    sharded checkpoint, it loads into one process with the same predictions as the sharded one."""
    from checkpoint_runs import rewrite_as_version_1

    reference = straight(tmp_path_factory)
    run = single(tmp_path_factory)
    assert run["results"]["predict_version_1"]["step"] == STEPS
    np.testing.assert_array_equal(np.load(os.path.join(run["out"], "predict_version_1_predictions.npy")),
                                  np.load(os.path.join(run["out"], "predict_predictions.npy")))
    manifest = checkpoint_store.read_manifest(run["version_1"])
    assert manifest["version"] == 1 and all("slices" not in t for t in manifest["tables"])
    assert rewrite_as_version_1 and reference


@pytest.mark.parametrize("other", ["single", "table_wise"])
def test_restore_on_another_world_size_and_plan_gives_the_same_results(other, tmp_path_factory):
    reference = straight(tmp_path_factory)
    run = single(tmp_path_factory) if other == "single" else table_wise(tmp_path_factory)
    mine, theirs = run["results"]["predict"], reference["results"]["predict"]
    assert mine["step"] == theirs["step"] == STEPS
    assert abs(mine["auc"] - theirs["auc"]) <= 1e-6, (mine, theirs)
    assert abs(mine["logloss"] - theirs["logloss"]) <= 1e-6, (mine, theirs)
    expected = np.load(os.path.join(reference["out"], "predict_predictions.npy"))
    actual = np.load(os.path.join(run["out"], "predict_predictions.npy"))
    assert expected.shape == actual.shape == (384,)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["single", "straight", "table_wise"])
def test_metrics_gathered_to_rank_0_equal_those_of_every_rank_holding_every_score(name, tmp_path_factory):
    """1, 2 and 3 ranks, 1500 samples in 4 batches of 384 (the last one padded): rank 0 alone puts the
    scores back in the split's order, bit for bit the figures of the former allgather on every rank."""
    run = {"single": single, "straight": straight, "table_wise": table_wise}[name](tmp_path_factory)
    predicted = run["results"]["predict"]
    assert predicted["samples"] == 1500
    assert predicted["metrics"] == predicted["every_rank_metrics"], predicted
    assert 0.5 < predicted["metrics"]["auc"] < 1 and 0.1 < predicted["metrics"]["positive_rate"] < 0.9


def test_training_run_evaluates_like_its_restored_checkpoint(tmp_path_factory):
    reference = straight(tmp_path_factory)
    final = reference["results"]["train"]
    restored = reference["results"]["predict"]
    assert final["steps"] == STEPS
    assert abs(final["auc"] - restored["auc"]) <= 1e-6 and abs(final["logloss"] - restored["logloss"]) <= 1e-6


def _copy(run, tmp_path) -> str:
    directory = str(tmp_path / f"ckpt-{STEPS:08d}")
    shutil.copytree(ckpt(run["save"], STEPS), directory)
    return directory


def test_truncated_file_is_refused_naming_it(tmp_path_factory, tmp_path):
    directory = _copy(straight(tmp_path_factory), tmp_path)
    path = os.path.join(directory, "tables", "table_005.cols_4-8.npy")
    with open(path, "r+b") as handle:
        handle.truncate(os.path.getsize(path) // 2)
    with pytest.raises(checkpoint_store.CheckpointError, match=r"tables/table_005\.cols_4-8\.npy.*truncated"):
        checkpoint_store.verify_files(directory, checkpoint_store.read_manifest(directory))


def test_wrong_checksum_is_refused_naming_the_file(tmp_path_factory, tmp_path):
    directory = _copy(straight(tmp_path_factory), tmp_path)
    path = os.path.join(directory, "dense", "top_mlp.dense_0.kernel.npy")
    with open(path, "r+b") as handle:
        handle.seek(-3, os.SEEK_END)
        byte = handle.read(1)
        handle.seek(-3, os.SEEK_END)
        handle.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(checkpoint_store.CheckpointError, match=r"dense/top_mlp\.dense_0\.kernel\.npy fails its sha256"):
        checkpoint_store.verify_files(directory, checkpoint_store.read_manifest(directory))


def test_refusals_through_the_command_line(tmp_path_factory):
    results = single(tmp_path_factory)["results"]
    assert "tables/table_006.cols_0-4.npy" in results["truncated"]["error"] and "truncated" in results["truncated"]["error"]
    assert "--embedding_dim: 8 in the checkpoint, 16 from the flags" in results["wrong_model"]["error"]
    assert "--bottom_mlp_dims" in results["wrong_model"]["error"]
    assert "feature cat_7.bin: cardinality 5000 in the checkpoint, 5001" in results["wrong_spec"]["error"]
    assert "--optimizer=adam" in results["wrong_optimizer"]["error"]
    assert "--embedding_optimizer=rowwise_adagrad" in results["wrong_embedding_optimizer"]["error"]


class _Trap:
    """Unpickling this would create a file: proof that loading executed code."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickled_arrays_and_escaping_paths_are_refused_without_running_code(tmp_path_factory, tmp_path):
    directory = _copy(straight(tmp_path_factory), tmp_path)
    marker = str(tmp_path / "code_ran")
    name = "dense/top_mlp.dense_1.bias.npy"
    trap = np.empty(1, dtype=object)
    trap[0] = _Trap(marker)
    np.save(os.path.join(directory, name), trap, allow_pickle=True)
    manifest_path = os.path.join(directory, "manifest.json")
    with open(manifest_path) as handle:
        manifest = json.load(handle)
    # An attacker can recompute the checksums, so they pass; the array is still refused.
    manifest["files"][name].update(bytes=os.path.getsize(os.path.join(directory, name)),
                                   sha256=checkpoint_store._sha256(os.path.join(directory, name)))
    with open(manifest_path, "w") as handle:
        json.dump(manifest, handle)
    checkpoint_store.verify_files(directory, checkpoint_store.read_manifest(directory))
    with pytest.raises(checkpoint_store.CheckpointError, match=r"top_mlp\.dense_1\.bias\.npy is not a plain \.npy"):
        checkpoint_store.load_array(directory, name, (1,), np.float32)
    assert not os.path.exists(marker)

    manifest["files"]["../../outside.npy"] = manifest["files"].pop(name)
    with open(manifest_path, "w") as handle:
        json.dump(manifest, handle)
    with pytest.raises(checkpoint_store.CheckpointError, match="unsafe file name"):
        checkpoint_store.read_manifest(directory)


def test_latest_ignores_unpublished_and_incomplete_directories(tmp_path_factory, tmp_path):
    run = straight(tmp_path_factory)
    for step in (EVERY, STEPS):
        shutil.copytree(ckpt(run["save"], step), tmp_path / f"ckpt-{step:08d}")
    # A save killed before its rename, and a directory without manifest (e.g. a partial copy).
    shutil.copytree(ckpt(run["save"], STEPS), tmp_path / ".ckpt-00000015.tmp")
    os.makedirs(tmp_path / "ckpt-00000020" / "tables")
    assert checkpoint_store.latest_checkpoint(str(tmp_path)) == str(tmp_path / f"ckpt-{STEPS:08d}")
    assert checkpoint_store.resolve(str(tmp_path)) == str(tmp_path / f"ckpt-{STEPS:08d}")
    with pytest.raises(checkpoint_store.CheckpointError, match="not a complete checkpoint"):
        checkpoint_store.read_manifest(str(tmp_path / "ckpt-00000020"))
    checkpoint_store.remove_stale(str(tmp_path))
    assert not os.path.exists(tmp_path / ".ckpt-00000015.tmp")


def test_only_the_newest_checkpoints_are_kept(tmp_path_factory):
    """The -np 3 run saved at steps 6, 8 and 10 with --keep_checkpoints=2."""
    run = table_wise(tmp_path_factory)
    assert sorted(os.listdir(run["save"])) == [".lock", "ckpt-00000008", "ckpt-00000010", "latest"]  # .lock: the run's own (lock.py)
