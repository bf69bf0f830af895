"""benchmarks/step_breakdown.py and benchmarks/dense_allreduce.py on the tiny config: the records'
shape, and bytes that agree between ranks."""

from __future__ import annotations

import json

import pytest

from conftest import run_python

PHASES = {"input", "lookup", "exchange", "dense_forward", "dense_forward_backward", "dense_backward", "allreduce", "update", "step"}


@pytest.mark.multirank
def test_step_breakdown_records(tmp_path):
    done = run_python(["benchmarks/step_breakdown.py", "--config=tiny", "--steps=1", f"--work_dir={tmp_path}"], timeout=600)
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted((r["mode"], r["rank"]) for r in records) == [("horovod", 0), ("horovod", 1), ("independent", 0), ("independent", 1)]
    for record in records:
        assert set(record["ms"]) == PHASES and set(record["waiting_ms"]) == PHASES - {"dense_backward"}
        assert all(value >= 0 for value in record["waiting_ms"].values())
        assert record["step_ms"] > 0 and record["phase_sum_ms"] > 0
    horovod = {r["rank"]: r["bytes_per_step"] for r in records if r["mode"] == "horovod"}
    assert horovod[0]["alltoall_forward_sent"] == horovod[1]["alltoall_forward_received"] > 0
    assert horovod[0]["allreduce_payload"] == horovod[1]["allreduce_payload"] > 0
    assert all(r["bytes_per_step"]["total_sent"] == 0 for r in records if r["mode"] == "independent")
    # main.py's choice of Horovod's cycle (tf_dlrm.cli.cycle_time): the tiny model keeps Horovod's 1 ms.
    assert all(r["horovod_cycle_time"].startswith("horovod cycle time: 1 ms (Horovod default) (auto:")
               for r in records if r["mode"] == "horovod"), records


@pytest.mark.multirank
def test_dense_allreduce_records():
    done = run_python(["benchmarks/dense_allreduce.py", "--config=tiny", "--repeats=2", "--settings=default,HOROVOD_CYCLE_TIME=5"], timeout=600)
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted((r["setting"], r["mode"]) for r in records) == sorted(
        (s, m) for s in ("default", "HOROVOD_CYCLE_TIME=5") for m in ("grouped", "per_gradient", "bfloat16_mean"))
    for record in records:
        assert record["ms"]["median"] > 0
        ring = record["payload_bytes"]  # 2 (N - 1) / N P at N = 2
        assert record["sent_bytes_per_rank"] == (ring // 2 if record["mode"] == "bfloat16_mean" else ring)
