"""The runs the checkpoint tests share, each launched once per pytest session and cached.

A tiny synthetic dataset (synthetic_small: 5 replicated and 3 model-parallel tables; 1536 training
samples = 8 batches of 192; 1500 validation samples) and a small model trained with Adam under a
warmup + decay schedule and row-wise Adagrad on the embeddings (one accumulator per row, which a
column-wise plan copies into every slice of the row), so that both optimizers' state and the
schedule position matter:

- ``straight``: ``-np 2`` column-wise, 10 steps straight, checkpoints at 5 and 10; then restores
  step 10 and predicts the first validation batch (same launch);
- ``killed``: the same run saving into another directory with slow saves, SIGKILLed (rank 0) in the
  middle of the save at step 10, then resumed with ``--resume`` in a second launch;
- ``table_wise``: ``-np 3`` table-wise, resumes from the straight run's step 5 and trains to 10
  (checkpoints every 2, keeps 2); then restores the straight run's step 10 and predicts;
- ``single``: one process: restores step 10 and predicts, runs eval / inference / export, and the
  refusals (wrong model, wrong spec, truncated file, wrong optimizer, export over a model).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import yaml

from conftest import HOROVODRUN, REPO, launch, one_each, run_python, worker_env

STEPS, EVERY = 10, 5
WORKER = "tests/checkpoint/checkpoint_worker.py"
SAVE_DELAY_S = 0.4  # per table: a save takes ~3 s, a window to kill it in
_cache: dict = {}


def model_flags(data: str) -> list[str]:
    return [
        f"--dataset_path={data}", "--embedding_dim=8", "--bottom_mlp_dims=16,8", "--top_mlp_dims=16,1",
        "--batch_size=192", "--valid_batch_size=384", "--epochs=2", "--learning_rate=0.05", "--optimizer=adam",
        "--embedding_optimizer=rowwise_adagrad", "--embedding_learning_rate=0.02",
        "--warmup_steps=2", "--decay_start_step=4", "--decay_steps=12", "--print_freq=5", "--evals_per_epoch=0",
        # The worker's predictions (its "predict" task) are the model's own; --calibration's runs, evaluations and
        # exports are tests/cli/test_calibration_runs.py's.
        "--seed=7", "--calibration=none",
    ]


def ckpt(directory, step: int) -> str:
    return os.path.join(str(directory), f"ckpt-{step:08d}")


def dataset(tmp_path_factory) -> str:
    if "data" not in _cache:
        from tf_dlrm.data.synthetic import generate
        from tf_dlrm.spec.feature_spec import FeatureSpec

        directory = str(tmp_path_factory.mktemp("checkpoint_data"))
        spec = FeatureSpec.load(os.path.join(REPO, "feature_specs", "synthetic_small.yaml"), check_files=False)
        generate(spec, directory, num_train_samples=1536, num_valid_samples=1500, seed=1)
        # The same data described with one cardinality changed: a checkpoint of it must be refused.
        with open(os.path.join(directory, "feature_spec.yaml")) as handle:
            raw = yaml.safe_load(handle)
        raw["feature_spec"]["cat_7.bin"]["cardinality"] = 5001
        with open(os.path.join(directory, "feature_spec_changed.yaml"), "w") as handle:
            yaml.safe_dump(raw, handle, sort_keys=False)
        _cache["data"] = directory
    return _cache["data"]


def run_worker(num_ranks: int, tasks: list[dict], out_dir: str, env: dict | None = None) -> dict:
    tasks_path = os.path.join(out_dir, "tasks.json")
    with open(tasks_path, "w") as handle:
        json.dump(tasks, handle)
    if num_ranks == 1:
        run_python([WORKER, tasks_path, out_dir], env=env)
    else:
        launch(num_ranks, [WORKER, tasks_path, out_dir], env=env)
    with open(os.path.join(out_dir, "results.json")) as handle:
        return json.load(handle)


def straight(tmp_path_factory) -> dict:
    if "straight" not in _cache:
        data = dataset(tmp_path_factory)
        out = str(tmp_path_factory.mktemp("straight"))
        save = os.path.join(out, "checkpoints")
        flags = model_flags(data) + ["--dist_strategy=column_wise"]
        tasks = [
            {"name": "train", "action": "train", "argv": flags + [
                f"--max_steps={STEPS}", f"--checkpoint_every_steps={EVERY}", f"--save_checkpoint_path={save}",
                f"--log_path={out}/train.jsonl"]},
            {"name": "predict", "action": "predict", "argv": flags + [f"--restore_checkpoint_path={ckpt(save, STEPS)}"]},
        ]
        results = run_worker(2, tasks, out)
        _cache["straight"] = {"out": out, "save": save, "results": results}
    return _cache["straight"]


def table_wise(tmp_path_factory) -> dict:
    if "table_wise" not in _cache:
        reference = straight(tmp_path_factory)
        data = dataset(tmp_path_factory)
        out = str(tmp_path_factory.mktemp("table_wise"))
        save = os.path.join(out, "checkpoints")
        flags = model_flags(data) + ["--dist_strategy=table_wise"]
        tasks = [
            {"name": "train", "action": "train", "argv": flags + [
                f"--restore_checkpoint_path={ckpt(reference['save'], EVERY)}", f"--max_steps={STEPS}",
                "--checkpoint_every_steps=2", "--keep_checkpoints=2", f"--save_checkpoint_path={save}",
                f"--log_path={out}/train.jsonl"]},
            {"name": "predict", "action": "predict", "argv": flags + [f"--restore_checkpoint_path={ckpt(reference['save'], STEPS)}"]},
        ]
        results = run_worker(3, tasks, out)
        _cache["table_wise"] = {"out": out, "save": save, "results": results}
    return _cache["table_wise"]


def single(tmp_path_factory) -> dict:
    if "single" not in _cache:
        reference = straight(tmp_path_factory)
        data = dataset(tmp_path_factory)
        out = str(tmp_path_factory.mktemp("single"))
        flags = model_flags(data)
        final = ckpt(reference["save"], STEPS)
        corrupt = os.path.join(out, "corrupt", "ckpt-00000010")
        shutil.copytree(final, corrupt)
        table = os.path.join(corrupt, "tables", "table_006.cols_0-4.npy")
        with open(table, "r+b") as handle:
            handle.truncate(os.path.getsize(table) - 100)
        saved_model = os.path.join(out, "saved_model")
        version_1 = os.path.join(out, "version_1", "ckpt-00000010")
        rewrite_as_version_1(final, version_1)
        restore = [f"--restore_checkpoint_path={reference['save']}"]  # a directory of checkpoints: its latest
        tasks = [
            {"name": "predict", "action": "predict", "argv": flags + [f"--restore_checkpoint_path={final}"]},
            {"name": "predict_version_1", "action": "predict", "argv": flags + [f"--restore_checkpoint_path={version_1}"]},
            {"name": "eval", "action": "mode", "argv": flags + restore + ["--mode=eval", f"--log_path={out}/eval.jsonl"]},
            {"name": "inference", "action": "mode", "argv": flags + restore + [
                "--mode=inference", "--inference_batch_sizes=1,64,384", "--max_steps=20", f"--log_path={out}/inference.jsonl"]},
            {"name": "export", "action": "mode", "argv": flags + restore + ["--mode=export", f"--saved_model_path={saved_model}"]},
            {"name": "export_again", "action": "mode", "expect_error": True,
             "argv": flags + restore + ["--mode=export", f"--saved_model_path={saved_model}"]},
            {"name": "wrong_model", "action": "mode", "expect_error": True,
             "argv": flags + restore + ["--mode=eval", "--embedding_dim=16", "--bottom_mlp_dims=16,16"]},
            {"name": "wrong_spec", "action": "mode", "expect_error": True,
             "argv": flags + restore + ["--mode=eval", "--feature_spec=feature_spec_changed.yaml"]},
            {"name": "truncated", "action": "mode", "expect_error": True,
             "argv": flags + ["--mode=eval", f"--restore_checkpoint_path={corrupt}"]},
            {"name": "wrong_optimizer", "action": "train", "expect_error": True,
             "argv": flags + [f"--restore_checkpoint_path={final}", "--optimizer=sgd", f"--max_steps={STEPS + 1}"]},
            {"name": "wrong_embedding_optimizer", "action": "train", "expect_error": True,
             "argv": flags + [f"--restore_checkpoint_path={final}", "--embedding_optimizer=lazy_adam", f"--max_steps={STEPS + 1}"]},
        ]
        results = run_worker(1, tasks, out)
        _cache["single"] = {"out": out, "results": results, "saved_model": saved_model, "version_1": version_1}
    return _cache["single"]


def rewrite_as_version_1(source: str, target: str) -> None:
    """A copy of a sharded (version 2) checkpoint in the version-1 layout: every table and every
    embedding-state array as one full-table file, the manifest without slices."""
    from tf_dlrm.checkpoint import store

    shutil.copytree(source, target)
    manifest = store.read_manifest(target)
    for key in ("tables", "embedding_state"):
        for entry in manifest[key]:
            parts = [np.load(os.path.join(target, s["file"]), allow_pickle=False) for s in entry.pop("slices")]
            prefix = "tables/table" if key == "tables" else f"optimizer/embedding_{entry['slot']}_table"
            name = entry["file"] = f"{prefix}_{entry['table']:03d}.npy"
            manifest["files"][name] = store.write_npy(target, name, np.concatenate(parts, axis=1))
    listed = {e["file"] for key in ("tables", "embedding_state") for e in manifest[key]}
    for name in [n for n in manifest["files"] if ".cols_" in n and n not in listed]:
        os.remove(os.path.join(target, name))
        del manifest["files"][name]
    manifest["version"] = 1
    os.remove(os.path.join(target, store.MANIFEST))
    store.write_manifest(target, manifest)


def _rank_process(root_pid: int, rank: int):
    import psutil

    for child in psutil.Process(root_pid).children(recursive=True):
        try:
            if "main.py" in " ".join(child.cmdline()) and child.environ().get("HOROVOD_RANK") == str(rank):
                return child
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def killed_and_resumed(tmp_path_factory) -> dict:
    """Kills rank 0 while the step-10 save is half written, records what is on disk, resumes."""
    if "killed" not in _cache:
        data = dataset(tmp_path_factory)
        out = str(tmp_path_factory.mktemp("killed"))
        save = os.path.join(out, "checkpoints")
        flags = model_flags(data) + [
            "--dist_strategy=column_wise", f"--max_steps={STEPS}", f"--checkpoint_every_steps={EVERY}",
            f"--save_checkpoint_path={save}",
        ]
        half_written = os.path.join(save, f".ckpt-{STEPS:08d}.tmp", "tables", "table_002.npy")
        command = [HOROVODRUN, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, "main.py", *one_each(flags)]
        env = worker_env({"TF_DLRM_TEST_CHECKPOINT_DELAY_S": str(SAVE_DELAY_S)})
        with open(os.path.join(out, "killed.log"), "w") as log:
            process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
            deadline, victim = time.time() + 300, None
            while time.time() < deadline and process.poll() is None:
                if os.path.exists(half_written):
                    victim = _rank_process(process.pid, 0)
                    if victim is not None:
                        victim.send_signal(signal.SIGKILL)
                        break
                time.sleep(0.02)
            on_disk = {
                "killed": victim is not None,
                "listing": sorted(os.listdir(save)) if os.path.isdir(save) else [],
            }
            try:
                on_disk["exit_code"] = process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()
                on_disk["exit_code"] = "hung"
        on_disk["listing_after_exit"] = sorted(os.listdir(save))
        resume_log = os.path.join(out, "resume.jsonl")
        resumed = launch(2, ["main.py", *flags, "--resume", f"--log_path={resume_log}"])
        with open(resume_log) as handle:
            events = [json.loads(line) for line in handle]
        _cache["killed"] = {"save": save, "on_disk": on_disk, "events": events, "output": resumed.stdout + resumed.stderr}
    return _cache["killed"]


def checkpoint_arrays(directory: str) -> dict[str, np.ndarray]:
    """Every array of a checkpoint (loaded the safe way): a table or embedding state by its entry's
    name, its column slices joined side by side and its row bands one under the other (the sharded
    layout depends on the saving plan), others by file."""
    with open(os.path.join(directory, "manifest.json")) as handle:
        manifest = json.load(handle)
    arrays, sliced = {}, set()
    for key in ("tables", "embedding_state"):
        for entry in manifest.get(key, []):
            parts = entry.get("slices") or [{"file": entry["file"]}]
            sliced.update(part["file"] for part in parts)
            bands = {}
            for part in sorted(parts, key=lambda p: (p.get("rows", [0])[0], p.get("columns", [0])[0])):
                bands.setdefault(part.get("rows", [0])[0], []).append(
                    np.load(os.path.join(directory, part["file"]), allow_pickle=False))
            arrays[f"{key}/{entry['name']}"] = np.concatenate(
                [np.concatenate(columns, axis=1) for _, columns in sorted(bands.items())], axis=0)
    for name in manifest["files"]:
        if name.endswith(".npy") and name not in sliced:
            arrays[name] = np.load(os.path.join(directory, name), allow_pickle=False)
    return arrays


def max_difference(first: str, second: str) -> tuple[float, str]:
    """Largest absolute difference over all arrays of two checkpoints, and the file where it is."""
    a, b = checkpoint_arrays(first), checkpoint_arrays(second)
    assert sorted(a) == sorted(b), f"{first} and {second} hold different files"
    worst, where = 0.0, ""
    for name in a:
        difference = float(np.abs(a[name].astype(np.float64) - b[name].astype(np.float64)).max(initial=0.0))
        if difference > worst:
            worst, where = difference, name
    return worst, where
