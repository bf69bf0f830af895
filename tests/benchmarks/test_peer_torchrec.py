"""benchmarks/peer_torchrec.py: a missing peer is one line and exit 0, the summaries are medians of the rounds,
and (where TorchRec is set up) one real tiny round of both frameworks on the same model."""

from __future__ import annotations

import json
import os
import pathlib
import sys

import pytest

from conftest import run_python

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import peer_torchrec  # noqa: E402

PEER_PYTHON = os.path.join(peer_torchrec.PEER, "trvenv", "bin", "python")


def test_missing_peer_is_one_line_and_exit_zero(tmp_path):
    done = run_python(["benchmarks/peer_torchrec.py", f"--peer_python={tmp_path}/none"], timeout=120)
    assert done.stdout.strip().splitlines() == [
        f"peer_torchrec: skipped, TorchRec is not set up (no peer Python at {tmp_path}/none); see benchmarks/README.md"]


def test_summaries_are_medians_over_rounds():
    args = peer_torchrec.parse_args(["--threads=1", "--optimizers=sgd", "--torch_variants=stock", "--rounds=3"])
    runs = [{"framework": "tf_dlrm", "variant": None, "threads": 1, "batch_size": 8, "samples_per_s": {"sgd": rate},
             "matmul_gflops_per_s": 10.0} for rate in (100.0, 300.0, 200.0)]
    runs += [{"framework": "torchrec", "variant": "stock", "threads": 1, "batch_size": 8, "samples_per_s": {"sgd": rate},
              "matmul_gflops_per_s": gflops, "versions": {}} for rate, gflops in ((50.0, 4.0), (100.0, 5.0), (400.0, 6.0))]
    [summary] = peer_torchrec.summaries(runs, args)
    assert (summary["tf_dlrm_samples_per_s"], summary["torchrec_samples_per_s"], summary["tf_dlrm_over_torchrec"]) == (200.0, 100.0, 2.0)
    assert (summary["tf_matmul_gflops_per_s"], summary["torch_matmul_gflops_per_s"]) == (10.0, 5.0)


@pytest.mark.skipif(not os.path.isfile(PEER_PYTHON), reason="TorchRec's peer venv is not set up here")
def test_one_real_round_on_the_tiny_config(tmp_path):
    done = run_python(["benchmarks/peer_torchrec.py", "--config=tiny", "--rounds=1", "--threads=1", "--optimizers=sgd,rowwise_adagrad",
                       "--warmup_steps=1", "--windows=1", "--window_steps=2", f"--work_dir={tmp_path}"], timeout=900)
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    runs = [r for r in records if r["benchmark"] == "peer_torchrec_run"]
    assert sorted((r["framework"], r["variant"]) for r in runs) == [
        ("tf_dlrm", None), ("torchrec", "mkl_intel_path"), ("torchrec", "stock")]
    assert len({r["dense_macs_per_sample"] for r in runs}) == 1  # the same model
    summaries = [r for r in records if r["benchmark"] == "peer_torchrec"]
    assert sorted((s["optimizer"], s["torchrec_variant"]) for s in summaries) == sorted(
        (o, v) for o in ("sgd", "rowwise_adagrad") for v in ("stock", "mkl_intel_path"))
    for s in summaries:
        assert s["tf_dlrm_over_torchrec"] == pytest.approx(s["tf_dlrm_samples_per_s"] / s["torchrec_samples_per_s"], rel=1e-2)
        assert s["tf_matmul_gflops_per_s"] > 0 and s["torch_matmul_gflops_per_s"] > 0
