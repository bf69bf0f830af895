"""Checkpoints under faults: no NaN checkpoint, the good ones kept, fallback past a corrupt newest one,
no resume on another batch size or dataset. All single-process runs of the real ``main.py``."""

from __future__ import annotations

import glob
import json
import os
import re

import numpy as np
import pytest

from conftest import run_python
from tiny_dataset import TINY_MODEL, write_tiny
from tf_dlrm.checkpoint import store as checkpoint_store


def train(data, save, *flags, check=True):
    return run_python(["main.py", f"--dataset_path={data}", *TINY_MODEL, f"--save_checkpoint_path={save}", *flags],
                      check=check, timeout=300)


def ckpt(save, step):
    return os.path.join(str(save), checkpoint_store.checkpoint_name(step))


def all_finite(directory) -> bool:
    return all(np.isfinite(np.load(path)).all() for path in glob.glob(os.path.join(directory, "*", "*.npy")))


@pytest.mark.slow
def test_a_diverging_run_saves_no_nan_checkpoint_and_keeps_the_good_ones(tmp_path):
    data, save = write_tiny(tmp_path / "data"), tmp_path / "save"
    train(data, save, "--max_steps=4", "--checkpoint_every_steps=2", "--keep_checkpoints=2")
    # Losses are read only every 1000 steps: the checkpoint itself must notice the NaN weights.
    diverged = train(data, save, "--resume", "--learning_rate=1e6", "--checkpoint_every_steps=1", "--keep_checkpoints=3",
                     "--print_freq=1000", "--epochs=3", check=False)
    assert diverged.returncode == 2, diverged.stderr[-3000:]
    assert "refusing to save a checkpoint at step" in diverged.stderr, diverged.stderr[-3000:]
    assert re.search(r"refusing to save a checkpoint at step \d+: the weights .* holds? NaN or inf \(the run diverged\); "
                     r"the last good checkpoint is kept: \S*ckpt-\d+", diverged.stderr), diverged.stderr[-3000:]
    assert "Traceback" not in diverged.stderr
    kept = checkpoint_store.list_checkpoints(str(save))
    assert len(kept) == 3 and kept[0][1] == ckpt(save, 4), kept  # the last one before the rate jumped is among them
    for _, directory in kept:
        checkpoint_store.verify_files(directory, checkpoint_store.read_manifest(directory))
        assert all_finite(directory), directory
    # The checkpoint from before the divergence evaluates to a real AUC.
    log = tmp_path / "eval.jsonl"
    run_python(["main.py", f"--dataset_path={data}", *TINY_MODEL, f"--restore_checkpoint_path={ckpt(save, 4)}",
                "--mode=eval", f"--log_path={log}"], timeout=300)
    final = json.loads(open(log).read().splitlines()[-1])
    assert 0 < final["auc"] < 1 and final["checkpoint"] == ckpt(save, 4), final
    # The newest kept one holds finite but exploded weights (training loss ~1e17 at its step): evaluating it
    # gives a real AUC or refuses in one line; it never reports an AUC of NaN scores.
    newest = run_python(["main.py", f"--dataset_path={data}", *TINY_MODEL, f"--save_checkpoint_path={save}", "--resume",
                         "--mode=eval", f"--log_path={tmp_path / 'newest.jsonl'}"], timeout=300, check=False)
    if newest.returncode == 0:
        final = json.loads(open(tmp_path / "newest.jsonl").read().splitlines()[-1])
        assert 0 < final["auc"] < 1 and final["checkpoint"] == kept[-1][1], final
    else:
        assert newest.returncode == 2 and "predicted scores are NaN or inf" in newest.stderr, newest.stderr[-3000:]
        assert "Traceback" not in newest.stderr


@pytest.mark.slow
def test_resume_falls_back_past_a_corrupt_newest_checkpoint(tmp_path):
    data, save = write_tiny(tmp_path / "data"), tmp_path / "save"
    train(data, save, "--max_steps=4", "--checkpoint_every_steps=2")
    table = os.path.join(ckpt(save, 4), "tables", "table_001.npy")
    with open(table, "r+b") as handle:
        handle.seek(-3, os.SEEK_END)
        handle.write(b"\x7f\x7f\x7f")
    log = tmp_path / "log.jsonl"
    resumed = train(data, save, "--resume", "--max_steps=6", "--checkpoint_every_steps=2", f"--log_path={log}")
    assert (f"skipped checkpoint {ckpt(save, 4)}: checkpoint {ckpt(save, 4)}: file tables/table_001.npy fails its "
            f"sha256 checksum: corrupt or modified; refusing to load it; moved it aside to {ckpt(save, 4)}.corrupt") in resumed.stderr
    assert f"restored checkpoint {ckpt(save, 2)} (step 2)" in resumed.stderr
    assert json.loads(open(log).read().splitlines()[-1])["steps"] == 6
    assert os.path.isdir(ckpt(save, 4) + ".corrupt")  # moved aside, not deleted
    assert [step for step, _ in checkpoint_store.list_checkpoints(str(save))] == [4, 6]


def _corrupt(directory):
    table = os.path.join(directory, "tables", "table_001.npy")
    with open(table, "r+b") as handle:
        handle.seek(-3, os.SEEK_END)
        handle.write(b"\x7f\x7f\x7f")


@pytest.mark.slow
def test_resume_that_finds_only_corrupt_checkpoints_stops_unless_told_to_start_over(tmp_path):
    data, save = write_tiny(tmp_path / "data"), tmp_path / "save"
    train(data, save, "--max_steps=4", "--checkpoint_every_steps=2")
    _corrupt(ckpt(save, 2))
    _corrupt(ckpt(save, 4))
    refused = train(data, save, "--resume", "--max_steps=6", check=False)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert (f"error (rank 0): --resume found only corrupt checkpoints under --save_checkpoint_path={save}, left where they "
            f"are: ckpt-00000004, ckpt-00000002 ({ckpt(save, 4)}: checkpoint {ckpt(save, 4)}: file tables/table_001.npy "
            "fails its sha256 checksum: corrupt or modified; refusing to load it). Expected an intact checkpoint to resume "
            "from. Received: 2 corrupt, 0 intact. Pass --restart_if_all_corrupt to move them aside and start from step 0"
            ) in refused.stderr, refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr and "starting from step 0" not in refused.stderr
    assert [step for step, _ in checkpoint_store.list_checkpoints(str(save))] == [2, 4]  # untouched
    restarted = train(data, save, "--resume", "--restart_if_all_corrupt", "--max_steps=2")
    assert f"every checkpoint under {save} is corrupt: starting from step 0 (--restart_if_all_corrupt)" in restarted.stderr
    assert os.path.isdir(ckpt(save, 2) + ".corrupt") and os.path.isdir(ckpt(save, 4) + ".corrupt")
    assert [step for step, _ in checkpoint_store.list_checkpoints(str(save))] == [2]


@pytest.mark.slow
def test_checkpoints_in_process_memory_are_refused(tmp_path):
    data = write_tiny(tmp_path / "data")
    for flags in (["--save_checkpoint_path=ram://x"], ["--save_checkpoint_path=ram://x", "--resume"],
                  ["--mode=eval", "--restore_checkpoint_path=ram://x/ckpt-00000016"]):
        flag, path = flags[-1 if flags[0] == "--mode=eval" else 0].removeprefix("--").split("=")
        refused = run_python(["main.py", f"--dataset_path={data}", *TINY_MODEL, *flags], check=False, timeout=300)
        assert refused.returncode == 2, refused.stderr[-3000:]
        assert refused.stderr.strip().splitlines()[-1] == (
            f"error (rank 0): --{flag}={path} is in this process's memory and ends with the process: no later run "
            "(--resume, --restore_checkpoint_path) could read a checkpoint from there. Expected a local directory or "
            f"lasting storage (gs://, s3://, hdfs://). Received: {flag}={path}"), refused.stderr[-3000:]


@pytest.mark.slow
def test_resume_with_another_batch_size_or_dataset_is_refused(tmp_path):
    data, save = write_tiny(tmp_path / "data"), tmp_path / "save"
    train(data, save, "--max_steps=2")
    other_batch = train(data, save, "--resume", "--batch_size=512", "--max_steps=4", check=False)
    assert other_batch.returncode == 2
    assert ("was trained with --batch_size=256; the flags give --batch_size=512, with which step 2 would point at "
            "other samples") in other_batch.stderr, other_batch.stderr[-3000:]
    other_seed = train(data, save, "--resume", "--seed=777", "--max_steps=4", check=False)
    assert other_seed.returncode == 2
    assert re.search(r"was trained with --seed=\d+; the flags give --seed=777, with which the batches after its step "
                     r"would come in another order", other_seed.stderr), other_seed.stderr[-3000:]
    other_data = write_tiny(tmp_path / "other", seed=1)  # same sizes, other samples
    refused = train(other_data, save, "--resume", "--max_steps=4", check=False)
    assert refused.returncode == 2
    assert "was trained on a different training split (file fingerprint" in refused.stderr, refused.stderr[-3000:]
    assert [step for step, _ in checkpoint_store.list_checkpoints(str(save))] == [2]


@pytest.mark.slow
def test_a_second_trainer_on_the_same_directory_is_refused_naming_the_first(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from conftest import REPO, one_each, worker_env

    data, save = write_tiny(tmp_path / "data"), tmp_path / "save"
    args = one_each(["main.py", f"--dataset_path={data}", *TINY_MODEL, f"--save_checkpoint_path={save}", "--epochs=1000",
                     "--checkpoint_every_steps=5", "--keep_checkpoints=1", "--print_freq=5"])
    first = subprocess.Popen([sys.executable, *args], cwd=REPO, env=worker_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while not checkpoint_store.list_checkpoints(str(save)) and time.time() < deadline and first.poll() is None:
            time.sleep(0.2)
        assert checkpoint_store.list_checkpoints(str(save)), "the first run saved no checkpoint"
        second = run_python(args + ["--resume"], check=False)
        assert second.returncode == 2, second.stderr[-3000:]
        assert (f"--save_checkpoint_path={save} is in use by another training run (pid {first.pid} on host "
                in second.stderr), second.stderr[-3000:]
        assert "Traceback" not in second.stderr
        assert first.poll() is None, "the second run stopped the first"
        first.send_signal(signal.SIGTERM)
        output, _ = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 143, output[-3000:]
    interrupted = re.search(r"interrupted at step (\d+); last checkpoint: (\S+)", output)
    assert interrupted, output[-3000:]
    assert checkpoint_store.list_checkpoints(str(save))[-1][1] == interrupted.group(2)
    checkpoint_store.verify_files(interrupted.group(2), checkpoint_store.read_manifest(interrupted.group(2)))
    assert not [n for n in os.listdir(save) if n.startswith(".ckpt-")]  # no temporary left by either run
