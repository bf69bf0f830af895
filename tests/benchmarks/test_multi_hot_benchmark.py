"""benchmarks/multi_hot_throughput.py on a tiny size: one record per case, and the alltoall bytes of
the multi-hot config equal those of the same tables one-hot while it looks up many more ids."""

from __future__ import annotations

import json

from conftest import run_python


def test_multi_hot_benchmark_records():
    completed = run_python(["benchmarks/multi_hot_throughput.py", "--rows=300", "--batch_size=64", "--num_batches=2",
                            "--warmup_steps=1", "--windows=1", "--window_steps=1"], timeout=600)
    records = [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]
    throughput = {r["case"]: r for r in records if r["benchmark"] == "multi_hot_throughput"}
    assert set(throughput) == {"naive_sparse", "naive_ragged", "tf_dlrm"}
    assert throughput["tf_dlrm"]["impl"] == "tf_dlrm" and throughput["naive_ragged"]["impl"] == "naive_keras"
    for record in throughput.values():
        assert record["samples_per_s"]["median"] > 0 and record["vs_naive_sparse"] > 0
    (exchange,) = [r for r in records if r["benchmark"] == "multi_hot_alltoall_bytes"]
    for world_size, sent in exchange["per_world_size"].items():
        # Busiest rank: (N - 1) ranks x (64 / N) samples x its columns x 4 bytes; 26 features of
        # widths 64/96/128 hold 2496 columns, split over N ranks.
        columns = sent["one_hot"] // ((int(world_size) - 1) * (64 // int(world_size)) * 4)
        assert 2496 / int(world_size) <= columns < 2496
        assert sent["multi_hot"] == sent["one_hot"]
        assert sent["ids_per_step"] == 64 * sum(1 + (f * 19) // 25 for f in range(26))


def test_the_optional_cases_run():
    """The kernel / plain-TensorFlow and lazy-Adam cases build and train (one window each)."""
    cases = "naive_sparse,tf_dlrm_without_kernel,tf_dlrm_lazy_adam,tf_dlrm_lazy_adam_without_kernel"
    completed = run_python(["benchmarks/multi_hot_throughput.py", "--rows=300", "--batch_size=64", "--num_batches=2",
                            "--warmup_steps=1", "--windows=1", "--window_steps=1", f"--cases={cases}"], timeout=600)
    records = [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]
    throughput = {r["case"]: r for r in records if r["benchmark"] == "multi_hot_throughput"}
    assert set(throughput) == set(cases.split(","))
    assert all(r["samples_per_s"]["median"] > 0 for r in throughput.values())
