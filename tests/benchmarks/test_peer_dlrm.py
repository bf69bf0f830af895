"""benchmarks/peer_dlrm.py: the peer's command mirrors the config, its timing lines are parsed with
the warm-up dropped, a missing peer is refused by flag, and (where the peer is set up) one real round."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import peer_dlrm  # noqa: E402
from train_throughput import CONFIGS  # noqa: E402

PEER_PYTHON = os.path.join(peer_dlrm.PEER, "venv", "bin", "python")
PEER_SCRIPT = os.path.join(peer_dlrm.PEER, "dlrm", "dlrm_s_pytorch.py")


def test_peer_arguments_follow_the_config():
    arguments = dict(a.split("=", 1) for a in peer_dlrm.peer_arguments(CONFIGS["criteo_capped"], 0.05, 30, 5) if "=" in a)
    assert arguments["--arch-sparse-feature-size"] == "128"
    assert len(arguments["--arch-embedding-size"].split("-")) == 26
    assert arguments["--arch-embedding-size"].startswith("100000-") and arguments["--arch-embedding-size"].endswith("-4-3")
    assert arguments["--arch-mlp-bot"] == "13-512-256-128"
    assert arguments["--arch-mlp-top"] == "479-1024-1024-512-256-1"  # 128 + 27 * 26 / 2, DLRM's interaction
    assert arguments["--mini-batch-size"] == "2048" and arguments["--num-batches"] == "30"
    assert arguments["--data-size"] == str(2048 * 30)


def test_parse_peer_drops_the_warm_up_line():
    output = "\n".join([
        "Using CPU...",
        "Finished training it 5/15 of epoch 0, 323.17 ms/it, loss 0.084101",
        "Finished training it 10/15 of epoch 0, 189.43 ms/it, loss 0.084201",
        "Finished training it 15/15 of epoch 0, 161.39 ms/it, loss 0.083236",
    ])
    assert peer_dlrm.parse_peer(output, 5) == [189.43, 161.39]
    assert peer_dlrm.parse_peer("nothing", 5) == []


def test_missing_peer_is_refused_by_flag(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "peer_dlrm.py"), f"--peer_python={tmp_path}/none"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert f"--peer_python={tmp_path}/none: no such file" in done.stderr


@pytest.mark.skipif(not (os.path.isfile(PEER_PYTHON) and os.path.isfile(PEER_SCRIPT)), reason="the peer is not set up here")
def test_one_real_round_on_the_tiny_config():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "peer_dlrm.py"), "--config=tiny", "--rounds=1",
                           "--print_freq=2", "--peer_groups=1", "--windows=1", "--window_steps=2", "--no-amp"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    import json
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    summary = records[-1]
    assert summary["benchmark"] == "peer_dlrm" and summary["peer_samples_per_s"] > 0
    assert summary["tf_dlrm_over_peer"] == pytest.approx(summary["tf_dlrm_fp32_samples_per_s"] / summary["peer_samples_per_s"], rel=1e-2)
