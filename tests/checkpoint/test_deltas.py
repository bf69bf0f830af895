"""Delta publishing end to end, with real processes: ``main.py --delta_every_steps`` on 2 ranks (column slices,
replicated tables, hot rows) and on 1, ``--mode=export`` of checkpoints, ``python -m tf_dlrm.cli.apply_deltas``, and the
SavedModels served by a process that cannot import tf_dlrm.

Also row bands (``--row_slice_threshold``: each band's owner writes its rows).
The claim: an export of step S0 with the deltas of steps S0 -> S applied serves what an export of the checkpoint of
step S serves, bit for bit (both hold the same float32 bits: the deltas carry the rows as the run held them, as the
checkpoint does). Also: the refusals (a gap, a delta older than the export, an unreachable step) and the
fingerprint that finds changed rows.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from conftest import REPO, launch, run_python

pytestmark = pytest.mark.multirank

STEPS = 10
_cache: dict = {}


def _flags(data: str, optimizer: str) -> list[str]:
    return [f"--dataset_path={data}", "--embedding_dim=8", "--bottom_mlp_dims=16,8", "--top_mlp_dims=16,1",
            "--batch_size=192", "--valid_batch_size=384", "--epochs=2", "--learning_rate=0.05", "--optimizer=adam",
            f"--embedding_optimizer={optimizer}", "--embedding_learning_rate=0.02", "--print_freq=5",
            "--evals_per_epoch=0", "--seed=7",
            # A checkpoint saved during training holds no calibration map, the final one does: none, so that the
            # exports of both compare as the model's own scores.
            "--calibration=none"]


def _dataset(tmp_path_factory) -> str:
    if "data" not in _cache:
        from tf_dlrm.data.synthetic import generate
        from tf_dlrm.spec.feature_spec import FeatureSpec

        directory = str(tmp_path_factory.mktemp("delta_data"))
        spec = FeatureSpec.load(os.path.join(REPO, "feature_specs", "synthetic_small.yaml"), check_files=False)
        generate(spec, directory, num_train_samples=1536, num_valid_samples=384, seed=3)
        _cache["data"] = directory
    return _cache["data"]


def _batch(data: str, path: str) -> str:
    """The validation rows as the serving signature's inputs (``numerical`` float32, ``cat_<i>_bin`` int64)."""
    import yaml

    with open(os.path.join(data, "feature_spec.yaml")) as handle:
        spec = yaml.safe_load(handle)
    count = os.path.getsize(os.path.join(data, "validation", "label.bin"))
    numerical = len(spec["channel_spec"]["numerical"])
    batch = {"numerical": np.fromfile(os.path.join(data, "validation", "numerical.bin"), np.float16)
             .reshape(count, numerical).astype(np.float32)}
    for feature in spec["channel_spec"]["categorical"]:
        raw = np.fromfile(os.path.join(data, "validation", feature), np.uint8)
        width = raw.size // count
        batch[feature.replace(".", "_")] = raw.view({1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}[width]).astype(np.int64)
    np.savez(path, **batch)
    return path


def _run(tmp_path_factory, name: str, ranks: int, extra: list[str], optimizer: str, exports: tuple) -> dict:
    """Trains ``STEPS`` steps with deltas and checkpoints, then exports the checkpoints of ``exports`` (one process)."""
    if name not in _cache:
        data = _dataset(tmp_path_factory)
        out = str(tmp_path_factory.mktemp(name))
        flags = _flags(data, optimizer)
        train = flags + extra + [f"--max_steps={STEPS}", f"--save_checkpoint_path={out}/checkpoints",
                                 "--keep_checkpoints=20", f"--delta_dir={out}/deltas"]
        if ranks == 1:
            run_python(["main.py", *train])
        else:
            launch(ranks, ["main.py", *train])
        for step in exports:
            run_python(["main.py", *flags, "--mode=export", f"--restore_checkpoint_path={out}/checkpoints/ckpt-{step:08d}",
                        f"--saved_model_path={out}/export_{step}"])
        _cache[name] = {"out": out, "deltas": f"{out}/deltas"}
    return _cache[name]


def two_ranks(tmp_path_factory) -> dict:
    # Hot rows: the replicas hold the model's values of the most looked-up rows, the owners' copies are stale.
    return _run(tmp_path_factory, "two_ranks", 2, ["--dist_strategy=column_wise", "--delta_every_steps=2",
                                                   "--checkpoint_every_steps=2", "--hot_rows_budget=0.05"],
                "rowwise_adagrad", (4, STEPS))


def row_bands(tmp_path_factory) -> dict:
    # Every model-parallel table cut into 2 row bands (--row_slice_threshold): each band owner writes its rows' changes.
    return _run(tmp_path_factory, "row_bands", 2, ["--row_slice_threshold=1", "--delta_every_steps=2",
                                                   "--checkpoint_every_steps=2"], "lazy_adam", (4, STEPS))


def one_rank(tmp_path_factory) -> dict:
    # Deltas every 3 steps, a checkpoint every step: the checkpoint of step 6 starts a chain (6 -> 9), the one of
    # step 4 does not (the delta after it holds 3 -> 6).
    return _run(tmp_path_factory, "one_rank", 1, ["--delta_every_steps=3", "--checkpoint_every_steps=1"],
                "catch_up_adam", (4, 6, 9))


def _dynamic_dataset(tmp_path_factory) -> str:
    """Sparse int64 keys (every feature a dynamic table) in shards too small for them: LRU evicts in every step."""
    if "dynamic_data" not in _cache:
        import yaml

        from tf_dlrm.data.hidden_model import GeneratorConfig
        from tf_dlrm.data.synthetic import generate
        from tf_dlrm.spec.feature_spec import FeatureSpec

        directory = str(tmp_path_factory.mktemp("delta_dynamic_data"))
        spec = FeatureSpec.load(os.path.join(REPO, "feature_specs", "synthetic_small.yaml"), check_files=False)
        generate(spec, directory, num_train_samples=1536, num_valid_samples=384, seed=3,
                 config=GeneratorConfig(hashed_keys=True))
        path = os.path.join(directory, "feature_spec.yaml")
        with open(path) as handle:
            raw = yaml.safe_load(handle)
        for properties in raw["feature_spec"].values():
            if properties.get("dynamic"):
                properties.update(capacity=min(int(properties["capacity"]), 60), eviction="lru")
        with open(path, "w") as handle:
            yaml.safe_dump(raw, handle, sort_keys=False)
        _cache["dynamic_data"] = directory
    return _cache["dynamic_data"]


def dynamic_two_ranks(tmp_path_factory) -> dict:
    if "dynamic" not in _cache:
        data = _dynamic_dataset(tmp_path_factory)
        out = str(tmp_path_factory.mktemp("dynamic_two_ranks"))
        flags = _flags(data, "adagrad") + ["--embedding_dim=4", "--bottom_mlp_dims=8,4", "--top_mlp_dims=8,1"]
        launch(2, ["main.py", *flags, f"--max_steps={STEPS}", f"--save_checkpoint_path={out}/checkpoints",
                   "--checkpoint_every_steps=2", "--keep_checkpoints=20", "--delta_every_steps=2", f"--delta_dir={out}/deltas",
                   f"--log_path={out}/train.jsonl"])
        for step in (4, STEPS):
            run_python(["main.py", *flags, "--mode=export", f"--restore_checkpoint_path={out}/checkpoints/ckpt-{step:08d}",
                        f"--saved_model_path={out}/export_{step}"])
        _apply(f"{out}/export_4", f"{out}/deltas", f"{out}/applied_{STEPS}")
        batch = _batch(data, os.path.join(out, "batch.npz"))
        arguments = []
        for name in (f"applied_{STEPS}", f"export_{STEPS}", "export_4"):
            arguments += [f"{out}/{name}", batch, f"{out}/{name}.npy", "--"]
        run_python(["tests/cli/serve_saved_model.py", *arguments[:-1]])
        _cache["dynamic"] = {"out": out, "deltas": f"{out}/deltas"}
    return _cache["dynamic"]


def _apply(export: str, deltas: str, output: str, *more: str, check: bool = True):
    return run_python(["-m", "tf_dlrm.cli.apply_deltas", f"--saved_model_path={export}", f"--delta_dir={deltas}",
                       f"--output_path={output}", *more], check=check)


def _served(tmp_path_factory) -> dict:
    """Every SavedModel compared, scored on the validation rows by one plain-TensorFlow process."""
    if "served" not in _cache:
        two, one, rows = two_ranks(tmp_path_factory), one_rank(tmp_path_factory), row_bands(tmp_path_factory)
        _apply(f"{two['out']}/export_4", two["deltas"], f"{two['out']}/applied_{STEPS}")
        _apply(f"{rows['out']}/export_4", rows["deltas"], f"{rows['out']}/applied_{STEPS}")
        _apply(f"{one['out']}/export_6", one["deltas"], f"{one['out']}/applied_9")
        out = str(tmp_path_factory.mktemp("delta_served"))
        batch = _batch(_dataset(tmp_path_factory), os.path.join(out, "batch.npz"))
        models = {"two_applied": f"{two['out']}/applied_{STEPS}", "two_full": f"{two['out']}/export_{STEPS}",
                  "two_base": f"{two['out']}/export_4", "one_applied": f"{one['out']}/applied_9",
                  "one_full": f"{one['out']}/export_9", "rows_applied": f"{rows['out']}/applied_{STEPS}",
                  "rows_full": f"{rows['out']}/export_{STEPS}"}
        arguments = []
        for name, model in models.items():
            arguments += [model, batch, os.path.join(out, f"{name}.npy"), "--"]
        run_python(["tests/cli/serve_saved_model.py", *arguments[:-1]])
        _cache["served"] = {name: np.load(os.path.join(out, f"{name}.npy")) for name in models}
    return _cache["served"]


@pytest.mark.parametrize("run", ["two", "one", "rows"])
def test_an_export_brought_forward_by_deltas_serves_as_the_full_export(tmp_path_factory, run):
    scores = _served(tmp_path_factory)
    applied, full = scores[f"{run}_applied"], scores[f"{run}_full"]
    assert applied.shape == full.shape == (384,)
    print(f"{run}: max |applied - full export| = {np.max(np.abs(applied - full)):.3g} over {full.size} rows")
    np.testing.assert_array_equal(applied, full)  # the same float32 bits: same graph, same variables
    if run == "two":  # the deltas did change the model
        assert np.max(np.abs(scores["two_base"] - full)) > 1e-3


def test_applied_variables_are_the_full_exports_bit_for_bit(tmp_path_factory):
    import tensorflow as tf

    _served(tmp_path_factory)
    run = two_ranks(tmp_path_factory)
    applied = tf.train.load_checkpoint(f"{run['out']}/applied_{STEPS}/variables/variables")
    full = tf.train.load_checkpoint(f"{run['out']}/export_{STEPS}/variables/variables")
    names = set(full.get_variable_to_dtype_map())
    assert set(applied.get_variable_to_dtype_map()) == names
    for name in names:
        assert np.array_equal(applied.get_tensor(name), full.get_tensor(name)), name
    with open(f"{run['out']}/applied_{STEPS}/tf_dlrm_serving.json") as handle:
        info = json.load(handle)
    assert (info["step"], info["base_step"]) == (STEPS, 4)
    assert [os.path.basename(path) for path in info["deltas"]] == ["delta-00000006", "delta-00000008", "delta-00000010"]


def test_deltas_hold_only_changed_rows(tmp_path_factory):
    """A step reaches a few hundred of the 5000 rows of the largest table: a delta holds those, not the table."""
    run = two_ranks(tmp_path_factory)
    with open(os.path.join(run["deltas"], "delta-00000004", "manifest.json")) as handle:
        manifest = json.load(handle)
    assert (manifest["step"], manifest["previous_step"], manifest["world_size"]) == (4, 2, 2)
    largest = manifest["tables"][-1]
    assert largest["rows"] == 5000
    assert {tuple(piece["columns"]) for piece in largest["pieces"]} == {(0, 4), (4, 8)}  # written by both ranks
    assert 0 < max(piece["count"] for piece in largest["pieces"]) < 1000
    # Row bands: each band's owner writes the changed rows of its band, as table row ids.
    with open(os.path.join(row_bands(tmp_path_factory)["deltas"], "delta-00000004", "manifest.json")) as handle:
        banded = json.load(handle)["tables"][-1]
    files = sorted(piece["rows"] for piece in banded["pieces"])
    assert files == ["tables/table_007.rows_0-2500.cols_0-8.rows.npy", "tables/table_007.rows_2500-5000.cols_0-8.rows.npy"], files
    for piece in banded["pieces"]:
        ids = np.load(os.path.join(row_bands(tmp_path_factory)["deltas"], "delta-00000004", piece["rows"]))
        low = 0 if "rows_0-" in piece["rows"] else 2500
        assert ids.size and low <= ids.min() and ids.max() < low + 2500


def test_a_gap_is_refused_naming_the_delta(tmp_path_factory):
    """A delta directory without its manifest (a write that never finished) is no delta: the chain has a gap there."""
    run = two_ranks(tmp_path_factory)
    broken = str(tmp_path_factory.mktemp("gap") / "deltas")
    shutil.copytree(run["deltas"], broken)
    os.remove(os.path.join(broken, "delta-00000006", "manifest.json"))
    output = os.path.join(os.path.dirname(broken), "applied")
    completed = _apply(f"{run['out']}/export_4", broken, output, check=False)
    assert completed.returncode == 2
    line = completed.stderr.strip().splitlines()[-1]
    assert line == (f"tf_dlrm.cli.apply_deltas: error: delta {broken}/delta-00000008 follows step 6, but the chain is at "
                    "step 4: the changes of steps 4 -> 6 are missing (delta-00000006 has no manifest: a write that never "
                    "finished); refusing a gap"), line
    assert not os.path.exists(output)


def test_a_delta_older_than_the_export_is_refused(tmp_path_factory):
    run = one_rank(tmp_path_factory)
    output = str(tmp_path_factory.mktemp("older") / "applied")
    completed = _apply(f"{run['out']}/export_4", run["deltas"], output, check=False)
    assert completed.returncode == 2
    line = completed.stderr.strip().splitlines()[-1]
    assert line.startswith(f"tf_dlrm.cli.apply_deltas: error: delta {run['deltas']}/delta-00000006 holds the changes of "
                           "steps 3 -> 6, which begin before step 4 where the model is"), line
    assert not os.path.exists(output)


def test_a_step_no_delta_reaches_is_refused(tmp_path_factory):
    run = two_ranks(tmp_path_factory)
    output = str(tmp_path_factory.mktemp("unreached") / "applied")
    completed = _apply(f"{run['out']}/export_4", run["deltas"], output, "--up_to_step=7", check=False)
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines()[-1] == (
        f"tf_dlrm.cli.apply_deltas: error: no published delta under {run['deltas']} reaches step 7: the chain from "
        "step 4 ends at step 6")


def test_the_fingerprint_sees_a_change_in_any_one_column():
    from tf_dlrm.checkpoint.deltas import row_fingerprints

    generator = np.random.default_rng(0)
    rows = generator.standard_normal((64, 16)).astype(np.float32)
    base = row_fingerprints(rows)
    for column in range(16):
        changed = rows.copy()
        changed[5, column] = np.nextafter(changed[5, column], np.float32(np.inf))  # the smallest change there is
        after = row_fingerprints(changed)
        assert after[5] != base[5] and np.array_equal(np.delete(after, 5), np.delete(base, 5)), column


def test_a_run_restarted_at_a_step_replaces_the_deltas_after_it(tmp_path_factory):
    """Training again from the checkpoint of step 6 makes the old delta of step 9 a state no chain reaches: the new
    run removes it (saying so) and writes its own, which follows step 6."""
    run = one_rank(tmp_path_factory)
    out = str(tmp_path_factory.mktemp("restarted"))
    shutil.copytree(run["deltas"], f"{out}/deltas")
    completed = run_python(["main.py", *_flags(_dataset(tmp_path_factory), "catch_up_adam"), f"--max_steps={STEPS}",
                            f"--restore_checkpoint_path={run['out']}/checkpoints/ckpt-00000006",
                            f"--save_checkpoint_path={out}/checkpoints", "--delta_every_steps=3", f"--delta_dir={out}/deltas"])
    assert (f"deltas: removed delta-00000009 under {out}/deltas: they are later than step 6, where this run starts"
            in completed.stdout + completed.stderr)
    assert sorted(os.listdir(f"{out}/deltas")) == ["delta-00000003", "delta-00000006", "delta-00000009"]
    with open(f"{out}/deltas/delta-00000009/manifest.json") as handle:
        assert json.load(handle)["previous_step"] == 6


def test_dynamic_tables_deltas_hold_changed_and_evicted_keys(tmp_path_factory):
    """Dynamic tables on 2 ranks, shards of 60 rows for hundreds of keys: each delta holds the keys whose rows changed
    (new keys among them) and the keys evicted since the last; the export of step 4 brought forward serves the
    validation keys (unseen ones among them) as the export of step 10 does, bit for bit."""
    run = dynamic_two_ranks(tmp_path_factory)
    out = run["out"]
    applied, full, base = (np.load(f"{out}/{name}.npy") for name in (f"applied_{STEPS}", f"export_{STEPS}", "export_4"))
    print(f"dynamic: max |applied - full export| = {np.max(np.abs(applied - full)):.3g} over {full.size} rows")
    np.testing.assert_array_equal(applied, full)
    assert np.max(np.abs(base - full)) > 1e-3
    with open(f"{run['deltas']}/delta-00000006/manifest.json") as handle:
        manifest = json.load(handle)
    pieces = [piece for table in manifest["dynamic"] for piece in table["pieces"]]
    assert {piece["rank"] for piece in pieces} == {0, 1}
    assert sum(piece["removed"] for piece in pieces) > 0 and sum(piece["count"] for piece in pieces) > 0
    with open(f"{out}/train.jsonl") as handle:
        final = [json.loads(line) for line in handle if '"dynamic_tables"' in line][-1]
    assert sum(table["evictions"] for table in final["tables"].values()) > 0, final
