"""``main.py`` checkpoints of dynamic tables (issue #16): saved by ``-np 2``, resumed on ``-np 3``,
evaluated on ``-np 3`` and exported from the 2-rank checkpoint; a fixed-table checkpoint is refused.

One dataset of sparse int64 keys (``tf_dlrm.data.synthetic --hashed_keys``: every categorical
feature a dynamic table, new keys in every batch, unseen keys in the validation split).

- Resume: 12 steps on 2 ranks, saved at 6 and 12; ``--resume`` from step 6 on 3 ranks (every key re-routed to its new owner
  with its row, Adagrad accumulator and LRU metadata) to step 12, across an epoch boundary; equal to
  12 uninterrupted steps on 2 ranks: losses, dense weights and Adam moments, every table's keys (exactly),
  rows and accumulators within 1e-5 (3 ranks sum the same gradients in another order than 2; the
  restore copies exact values), LRU metadata exactly.
- Eval on 3 ranks from the 2-rank checkpoint, and the SavedModel exported from it, served by
  TensorFlow alone on the whole validation split: the same AUC and logloss (1e-6); two keys no
  table ever saw give the same score (both read zeros), a seen key another.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from conftest import launch, one_each, run_python
from tf_dlrm.checkpoint import checkpointer as checkpoint
from tf_dlrm.checkpoint import store as checkpoint_store

FLAGS = ["--embedding_dim=4", "--bottom_mlp_dims=8,4", "--top_mlp_dims=8,1", "--batch_size=384", "--valid_batch_size=384",
         "--epochs=2", "--print_freq=1", "--seed=3", "--optimizer=adam", "--embedding_optimizer=adagrad"]
TRAIN, VALID = 4096, 1024  # 10 batches of 384 per epoch: step 12 is in the second epoch


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    from tf_dlrm.data.hidden_model import GeneratorConfig
    from tf_dlrm.data.synthetic import generate
    from tf_dlrm.spec.feature_spec import FeatureSpec

    root = tmp_path_factory.mktemp("dynamic_main_checkpoint")
    spec = FeatureSpec.load(os.path.join(os.path.dirname(__file__), "..", "..", "..", "feature_specs", "synthetic_small.yaml"),
                            check_files=False)
    generate(spec, str(root / "keys"), TRAIN, VALID, seed=3, config=GeneratorConfig(hashed_keys=True))
    generate(spec, str(root / "ids"), TRAIN, VALID, seed=3)
    return root


def events(path, kind):
    return [e for e in map(json.loads, open(path, encoding="utf-8")) if e["event"] == kind]


def ckpt(save, step):
    return os.path.join(str(save), checkpoint_store.checkpoint_name(step))


def dynamic_rows(directory):
    """{(table, field): array} with every rank's rows of a checkpoint, sorted by key."""
    manifest = checkpoint_store.read_manifest(directory)
    checkpoint_store.verify_files(directory, manifest)
    loaded = [np.load(os.path.join(directory, name)) for name in manifest["dynamic_tables"]["files"]]
    tables = sorted({name.split("_")[0] for name in loaded[0].files if name.startswith("t")})
    rows = {}
    for table in tables:
        keys = np.concatenate([f[f"{table}_keys"] for f in loaded])
        order = np.argsort(keys)
        for field in [n.split("_", 1)[1] for n in loaded[0].files if n.startswith(f"{table}_")]:
            if field.startswith("seen"):
                continue
            rows[table, field] = np.concatenate([f[f"{table}_{field}"] for f in loaded])[order]
    return rows


def dense_arrays(directory):
    manifest = checkpoint_store.read_manifest(directory)
    return {e["name"]: np.load(os.path.join(directory, e["file"])) for e in manifest["dense"] + manifest["optimizer_state"]}


def read_valid(data):
    from tf_dlrm.spec.feature_spec import FeatureSpec

    spec = FeatureSpec.load(str(data / "feature_spec.yaml"))
    split = data / "validation"
    labels = np.fromfile(split / "label.bin", np.bool_).astype(np.float32)
    numerical = np.fromfile(split / "numerical.bin", np.float16).astype(np.float32).reshape(len(labels), -1)
    keys = np.stack([np.fromfile(split / name, np.int64) for name in spec.categorical_features], axis=1)
    return labels, numerical, keys, list(spec.categorical_features)


def serving_inputs(numerical, keys, features) -> dict:
    """The signature's inputs: ``numerical`` and one input of raw keys per feature, under its serving name."""
    from tf_dlrm.embedding.serving import input_name

    return {"numerical": numerical, **{input_name(feature): keys[:, t] for t, feature in enumerate(features)}}


@pytest.mark.slow
@pytest.mark.multirank
def test_save_on_2_resume_on_3_eval_and_export(datasets, tmp_path):
    data = datasets / "keys"
    common = ["main.py", f"--dataset_path={data}", *FLAGS]
    reference, run = tmp_path / "reference", tmp_path / "run"
    # 12 steps on 2 ranks, saved at step 6 on the way (a save changes nothing of the training).
    launch(2, [*common, "--max_steps=12", "--checkpoint_every_steps=6", f"--save_checkpoint_path={reference}",
               f"--log_path={tmp_path / 'reference.jsonl'}"])
    # Published atomically: no temporary directory left, every rank's rows listed with its checksum.
    assert sorted(os.listdir(reference)) == [".lock", "ckpt-00000006", "ckpt-00000012", "latest"]
    assert sorted(os.listdir(os.path.join(ckpt(reference, 6), "dynamic"))) == [
        "dynamic_rank0.npz", "dynamic_rank1.npz", "dynamic_tables.json"]
    launch(3, [*common, "--max_steps=12", f"--save_checkpoint_path={run}", "--resume",
               f"--restore_checkpoint_path={ckpt(reference, 6)}", f"--log_path={tmp_path / 'second.jsonl'}"])
    restored = events(tmp_path / "second.jsonl", "checkpoint_restored")
    assert len(restored) == 1 and restored[0]["step"] == 6

    losses = {e["step"]: e["loss"] for e in events(tmp_path / "reference.jsonl", "train")}
    continued = events(tmp_path / "second.jsonl", "train")
    assert [e["step"] for e in continued] == list(range(7, 13))
    for event in continued:
        difference = abs(event["loss"] - losses[event["step"]])
        assert difference <= 1e-5, (event["step"], event["loss"], losses[event["step"]])
    print(f"losses of steps 7-12: max abs difference {max(abs(e['loss'] - losses[e['step']]) for e in continued)}")
    resumed, expected = dense_arrays(ckpt(run, 12)), dense_arrays(ckpt(reference, 12))
    assert sorted(resumed) == sorted(expected)
    worst = max(float(np.max(np.abs(resumed[n] - expected[n]))) for n in expected)
    print(f"dense weights and Adam moments: max abs difference {worst}")
    assert worst <= 1e-5
    resumed, expected = dynamic_rows(ckpt(run, 12)), dynamic_rows(ckpt(reference, 12))
    assert sorted(resumed) == sorted(expected) and ("t7", "slot_accumulator") in expected
    for (table, field), values in expected.items():
        if field in ("keys", "last_used", "use_count"):
            np.testing.assert_array_equal(resumed[table, field], values, err_msg=f"{table} {field}")
        else:
            difference = float(np.max(np.abs(resumed[table, field] - values), initial=0.0))
            print(f"{table} {field}: max abs difference {difference}")
            assert difference <= 1e-5, f"{table} {field} differs by {difference}"

    # Eval on 3 ranks and the SavedModel, both from the 2-rank checkpoint of step 6.
    launch(3, [*common, "--mode=eval", f"--restore_checkpoint_path={ckpt(reference, 6)}", f"--log_path={tmp_path / 'eval.jsonl'}"])
    final = events(tmp_path / "eval.jsonl", "final")[-1]
    run_python([*common, "--mode=export", f"--restore_checkpoint_path={ckpt(reference, 6)}",
                f"--saved_model_path={tmp_path / 'served'}"])
    import tensorflow as tf

    from tf_dlrm.metrics import exact_auc, logloss

    serve = tf.saved_model.load(str(tmp_path / "served")).signatures["serving_default"]
    labels, numerical, keys, features = read_valid(data)
    seen = {table: set(rows.tolist()) for (table, field), rows in dynamic_rows(ckpt(reference, 6)).items() if field == "keys"}
    unseen = sum(int(np.sum(~np.isin(keys[:, t], list(seen[f"t{t}"])))) for t in range(keys.shape[1]))
    assert unseen > 0, "the validation split holds no key unseen in training"
    scores = np.concatenate([serve(**{name: tf.constant(value) for name, value in serving_inputs(
        numerical[i:i + 256], keys[i:i + 256], features).items()})["probability"].numpy() for i in range(0, len(labels), 256)])
    served = (exact_auc(labels, scores), logloss(labels, scores))
    print(f"eval -np 3: AUC {final['auc']} logloss {final['logloss']}; SavedModel: AUC {served[0]} logloss {served[1]}; "
          f"{unseen} unseen keys")
    assert abs(served[0] - final["auc"]) <= 1e-6 and abs(served[1] - final["logloss"]) <= 1e-6
    # Unseen keys read zeros: two of them give the same score, a seen key another.
    last = keys.shape[1] - 1
    batch = np.repeat(keys[:1], 3, axis=0)
    batch[:, last] = [123456789, -987654321, sorted(seen[f"t{last}"])[0]]
    assert not {123456789, -987654321} & seen[f"t{last}"]
    probability = serve(**{name: tf.constant(value) for name, value in serving_inputs(
        np.repeat(numerical[:1], 3, axis=0), batch, features).items()})["probability"].numpy()
    assert probability[0] == probability[1] and probability[2] != probability[0], probability


@pytest.mark.slow
def test_a_fixed_table_checkpoint_is_refused_for_dynamic_tables(datasets, tmp_path):
    fixed = tmp_path / "fixed"
    run_python(["main.py", f"--dataset_path={datasets / 'ids'}", *FLAGS, "--max_steps=1", f"--save_checkpoint_path={fixed}"])
    wanted = "holds fixed embedding tables"
    for mode in ("train", "export"):
        target = tmp_path / f"{mode}_output"
        output_flag = f"--save_checkpoint_path={target}" if mode == "train" else f"--saved_model_path={target}"
        completed = run_python(["main.py", f"--dataset_path={datasets / 'keys'}", *FLAGS, f"--mode={mode}", "--max_steps=2",
                                f"--restore_checkpoint_path={ckpt(fixed, 1)}", output_flag], check=False)
        output = completed.stdout + completed.stderr
        assert completed.returncode != 0, output[-3000:]
        assert wanted in output and "dynamic: true in the feature spec" in output, output[-3000:]
        assert "Traceback" not in output, output[-3000:]
        assert not target.exists() or not os.listdir(target)


@pytest.mark.slow
def test_a_save_killed_half_way_leaves_the_previous_checkpoint_and_resumes(datasets, tmp_path):
    """SIGKILLed in the step-4 save, after the rows are written, before the manifest: step 2 stays the
    checkpoint, step 4 only a hidden temporary directory; ``--resume`` restarts from step 2. Then
    inference from the result, and a spec of fixed tables refusing it."""
    import signal
    import subprocess
    import sys
    import time

    from conftest import REPO, worker_env

    save = tmp_path / "save"
    args = ["main.py", f"--dataset_path={datasets / 'keys'}", *FLAGS, "--max_steps=4", "--checkpoint_every_steps=2",
            f"--save_checkpoint_path={save}"]
    process = subprocess.Popen([sys.executable, *one_each(args)], cwd=REPO, env=worker_env({checkpoint.DELAY_ENV: "5"}),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    half_written = save / ".ckpt-00000004.tmp" / "dynamic" / "dynamic_rank0.npz"
    try:
        deadline = time.time() + 300
        while not half_written.exists() and process.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert half_written.exists(), "the save never got half-way"
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    assert sorted(os.listdir(save)) == [".ckpt-00000004.tmp", ".lock", "ckpt-00000002", "latest"]
    log = tmp_path / "resumed.jsonl"
    run_python([*args, "--resume", f"--log_path={log}"])
    assert [e["step"] for e in events(log, "checkpoint_restored")] == [2] and events(log, "final")[-1]["steps"] == 4
    assert sorted(os.listdir(save)) == [".lock", "ckpt-00000002", "ckpt-00000004", "latest"]
    assert len(dynamic_rows(ckpt(save, 4))[("t7", "keys")]) > 0
    # Inference from it; a spec of fixed tables refuses it.
    inference = tmp_path / "inference.jsonl"
    run_python(["main.py", f"--dataset_path={datasets / 'keys'}", *FLAGS, "--mode=inference", f"--restore_checkpoint_path={save}", "--inference_batch_sizes=128",
                "--max_steps=3", f"--log_path={inference}"])
    assert events(inference, "final")[-1]["checkpoint"] == ckpt(save, 4)
    completed = run_python(["main.py", f"--dataset_path={datasets / 'ids'}", *FLAGS, "--mode=eval",
                            f"--restore_checkpoint_path={ckpt(save, 4)}"], check=False)
    assert completed.returncode != 0 and "holds dynamic embedding tables" in completed.stderr + completed.stdout
