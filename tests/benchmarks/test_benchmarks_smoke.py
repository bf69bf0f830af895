"""Every benchmark script runs on a tiny config and prints records of the documented shape.

One ``benchmarks/run_all.py --quick`` run covers train_throughput, loader_throughput and scaling
(two horovodrun launches), so the whole file takes about half a minute.
"""

from __future__ import annotations

import json

import pytest

from conftest import run_python

TRAIN_CASES = {("naive_keras", "fp32", False), ("naive_keras", "bf16", False), ("tf_dlrm", "fp32", False),
               ("tf_dlrm", "bf16", False), ("tf_dlrm", "fp32", True), ("mlp_only", "fp32", False)}


def check_samples_per_s(record):
    stats = record["samples_per_s"]
    assert set(stats) == {"median", "min", "max"}, record
    # Not min <= median <= max (true of any three sorted numbers): positive, finite rates.
    assert all(0 < value < float("inf") for value in stats.values()), record


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    output = tmp_path_factory.mktemp("bench") / "results.json"
    completed = run_python(["benchmarks/run_all.py", "--quick", "--config=tiny", "--small_config=tiny", f"--output={output}"],
                           timeout=300)
    records = json.loads(output.read_text())
    printed = [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]
    assert printed == records, "stdout and the output file disagree"
    return records


@pytest.mark.multirank
def test_train_throughput_records(results):
    train = [r for r in results if r["benchmark"] == "train_throughput"]
    assert {(r["impl"], r["precision"], r["xla"]) for r in train} == TRAIN_CASES
    for record in train:
        assert record["config"] == "tiny" and record["world_size"] == 1
        check_samples_per_s(record)
    naive = next(r for r in train if r["impl"] == "naive_keras" and r["precision"] == "fp32")
    for record in train:
        # The ratio is the printed medians' ratio (rounded to 3 places, the medians to 0.1).
        expected = record["samples_per_s"]["median"] / naive["samples_per_s"]["median"]
        assert abs(record["vs_naive_fp32"] - expected) <= 1e-3 + 1e-3 * expected, record


@pytest.mark.multirank
def test_loader_records(results):
    loader = [r for r in results if r["benchmark"] == "loader_throughput"]
    assert sorted(r["cache"] for r in loader) == ["cold", "warm"]
    for record in loader:
        check_samples_per_s(record)
        assert record["bytes_per_sample"] > 0


@pytest.mark.multirank
def test_check_overhead_records(results):
    checks = {r["case"]: r for r in results if r["benchmark"] == "check_overhead"}
    assert sorted(checks) == ["loader_checked", "loader_unchecked", "train_checked", "train_unchecked"]
    for record in checks.values():
        check_samples_per_s(record)
        assert record["impl"] == "tf_dlrm" and record["vs_unchecked"] > 0
    assert checks["train_unchecked"]["vs_unchecked"] == checks["loader_unchecked"]["vs_unchecked"] == 1.0
    assert checks["train_checked"]["check_ms_per_batch"] >= 0 and checks["train_checked"]["unchecked_ms_per_step"] > 0


@pytest.mark.multirank
def test_scaling_records(results):
    scaling = {r["world_size"]: r for r in results if r["benchmark"] == "scaling"}
    assert sorted(scaling) == [1, 2]
    for record in scaling.values():
        check_samples_per_s(record)
        assert record["impl"] == "tf_dlrm" and record["global_batch_size"] == 256
    assert scaling[1]["vs_world_size_1"] == 1.0 and scaling[1]["max_rank_embedding_fraction"] == 1.0
    # Two ranks split the model-parallel tables: each holds less than the whole.
    assert scaling[2]["max_rank_embedding_fraction"] < 1.0
    assert (scaling[2]["intra_op_threads"], scaling[1]["intra_op_threads"]) in {(1, 2), (1, 1)}
    # Two plain processes with no exchange ran in the same round: the ceiling of -np 2.
    check_samples_per_s(scaling[2]["no_exchange_ceiling"])
    assert scaling[2]["no_exchange_ceiling"]["vs_world_size_1"] > 0 and "no_exchange_ceiling" not in scaling[1]


@pytest.mark.multirank
def test_targets_record_names_every_check(results):
    targets = results[-1]
    assert targets["benchmark"] == "targets"
    names = " ".join(check["target"] for check in targets["checks"])
    for fragment in ("tf_dlrm fp32 / naive fp32", "--amp / naive fp32", "loader (cold cache)", "-np 2 / -np 1",
                     "max per-rank embedding bytes", "with the id and non-finite checks / without"):
        assert fragment in names
    assert all(isinstance(check["met"], bool) for check in targets["checks"])
    ceilings = {c["ceiling"]: c["value"] for c in targets["ceilings"]}
    assert set(ceilings) == {"tiny: the two MLPs alone / naive fp32", "tiny: 2 processes with no exchange / -np 1"}
    assert all(value > 0 for value in ceilings.values())


def check_cpu(record):
    """Figures from different CPUs must never be compared by mistake: each line names its CPU."""
    from tf_dlrm.train.precision import read_cpu_info

    cpu = record["cpu"]
    assert {k: cpu[k] for k in ("model", "avx2", "avx512f", "avx512_bf16", "amx_bf16")} == read_cpu_info().summary(), record
    assert isinstance(cpu["bf16_native"], bool) and isinstance(cpu["environment"], dict)


@pytest.mark.multirank
def test_every_record_names_the_cpu_it_was_measured_on(results):
    for record in results:
        check_cpu(record)


def test_interaction_kernel_benchmark_records():
    completed = run_python(["benchmarks/interaction_kernel.py", "--batch_size=64", "--tables=5", "--dims=4,16",
                            "--windows=1", "--window_steps=2"], timeout=300)
    records = [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]
    assert [(r["dim"], r["precision"]) for r in records] == [(4, "fp32"), (4, "bf16"), (16, "fp32"), (16, "bf16")]
    for record in records:
        assert record["benchmark"] == "interaction_kernel" and record["batch_size"] == 64 and record["speedup"] > 0
        check_cpu(record)
        for key in ("kernel_ms", "generic_ms", "kernel_forward_ms"):
            check_samples_per_s({"samples_per_s": record[key]})


def test_checkpoint_verify_records():
    done = run_python(["benchmarks/checkpoint_verify.py", "--tables=3", "--table_mib=8", "--rounds=1"], timeout=300)
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["impl"] for r in records] == ["one_thread", "thread_pool", "speedup"], done.stdout
    assert all(r["benchmark"] == "checkpoint_verify" and "cpu" in r for r in records)
    assert records[0]["threads"] == 1 and records[1]["threads"] >= 1 and records[0]["gib"] > 0.02
    assert records[2]["thread_pool_over_one_thread"] > 0


def test_sparse_ops_times_every_op_on_the_same_rows():
    completed = run_python(["benchmarks/sparse_ops.py", "--rows=2000", "--dim=8", "--ids=300", "--repeats=1", "--calls=1"],
                           timeout=300)
    records = [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]
    ops = {r["op"] for r in records}
    assert {"gather", "scatter_sub", "scatter_update", "unique", "unsorted_segment_sum"} <= ops, ops
    assert "tf_dlrm_sparse_apply_sgd" in ops  # the kernel library is built by the installer
    touched = {r["rows_touched"] for r in records}
    assert len(touched) == 1 and 0 < touched.pop() <= 300  # distinct rows of the 300 drawn, the same for every op
    for record in records:
        assert all(0 < value < float("inf") for value in record["ms"].values()), record
