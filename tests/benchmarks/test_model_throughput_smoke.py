"""benchmarks/model_throughput.py runs on the tiny config and prints one record per model and impl."""

from __future__ import annotations

import json

from conftest import run_python


def test_model_throughput_records():
    completed = run_python(["benchmarks/model_throughput.py", "--config=tiny", "--windows=1", "--window_steps=2",
                            "--warmup_steps=1", "--num_batches=2"], timeout=600)
    records = [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]
    assert {(r["model"], r["impl"]) for r in records} == {
        (m, i) for m in ("dcnv2", "deepfm", "wide_deep") for i in ("naive_keras", "tf_dlrm")}
    for record in records:
        assert record["benchmark"] == "model_throughput" and record["precision"] == "fp32"
        assert all(0 < v < float("inf") for v in record["samples_per_s"].values()), record
        assert record["vs_naive_fp32"] > 0
        assert record["cpu_ms_per_step"] > 0 and record["vs_naive_fp32_cpu"] > 0, record
