"""benchmarks/scaling_hot_rows.py: the Zipf sums against exact sums, the threshold plan against the
project's planner, and expected bytes against ids actually drawn and counted."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import scaling_hot_rows as model  # noqa: E402
import scaling_model  # noqa: E402
from tf_dlrm.sharding.hot_rows import plan_hot_rows  # noqa: E402
from tf_dlrm.sharding.plan import TableSpec  # noqa: E402
from tf_dlrm.sharding.planner import make_plan  # noqa: E402


def _probabilities(rows, exponent):
    weights = np.arange(1, rows + 1, dtype=np.float64) ** -exponent
    return weights / weights.sum()


@pytest.mark.parametrize("exponent", [0.6, 1.0, 1.05, 1.2])
def test_sums_beyond_the_exact_terms_match_exact_sums(exponent):
    rows = 400_000  # 20x the exact terms: most of the sum comes from the trapezoid part
    exact = float((np.arange(1, rows + 1, dtype=np.float64) ** -exponent).sum())
    assert model.harmonic(rows, exponent) == pytest.approx(exact, rel=1e-6)
    p = _probabilities(rows, exponent)
    for count, draws in ((100_000, 5000), (rows, 300_000)):
        expected = float((1 - (1 - p[:count]) ** draws).sum())
        assert model.distinct_draws(count, exponent, rows, draws) == pytest.approx(expected, rel=1e-4)


def test_threshold_plan_equals_the_planner_on_expected_counts():
    rows, exponents, dim = [50_000, 20_000, 9_000], [1.05, 1.2, 0.8], 16
    plan = make_plan([TableSpec(f"t{i}", r, dim) for i, r in enumerate(rows)], 2, "table_wise", data_parallel_threshold=1)
    # Counts proportional to the probabilities (integers large enough that rounding does not reorder rows).
    counts = [np.round(_probabilities(r, s) * 1e12).astype(np.int64) for r, s in zip(rows, exponents)]
    planned = plan_hot_rows(plan, counts, 0.05)
    zipf = model.plan_zipf_hot_rows(rows, [dim] * 3, exponents, planned.budget_bytes)
    for table, figures in enumerate(zipf):
        hot = planned.for_table(table)
        assert abs(figures["count"] - len(hot)) <= 1, (table, figures["count"], len(hot))
        assert list(hot) == list(range(len(hot)))  # the most frequent ids, as the model assumes
    assert sum(f["bytes"] for f in zipf) <= planned.budget_bytes


def test_expected_bytes_match_ids_drawn_and_counted():
    spec = importlib.util.spec_from_file_location("hot_rows_benchmark", ROOT / "benchmarks" / "hot_rows.py")
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    rows, exponent, world_size, batch, dim = [30_000] * 4, 1.1, 2, 4096, 8
    plan = make_plan([TableSpec(f"t{i}", r, dim) for i, r in enumerate(rows)], world_size, "table_wise",
                     data_parallel_threshold=1)
    figures = model.hot_row_figures(plan, [exponent] * 4, 0.1, batch)
    # The same rows, hot by exact probabilities, and bytes counted on drawn ids by the benchmark's code.
    counts = [np.round(_probabilities(r, exponent) * 1e12).astype(np.int64) for r in rows]
    hot = plan_hot_rows(plan, counts, 0.1)
    rng = np.random.default_rng(3)
    p = _probabilities(rows[0], exponent)
    draw = lambda count: [rng.choice(rows[0], count, p=p) for _ in rows]  # noqa: E731
    _, plain, replicated, hit_rate = benchmark.measure(plan, hot, draw, world_size, batch, batches=8, value_bytes=4)
    assert figures["alltoall_bytes_per_step_plain"] == pytest.approx(plain)
    assert figures["expected_hit_rate"] == pytest.approx(hit_rate, abs=0.01)
    assert figures["bytes_per_step_with_hot_rows"] == pytest.approx(replicated, rel=0.03)
    assert figures["hot_gradient_combine"] == "allgather_rows"


def test_fit_recovers_the_generator_exponent_roughly():
    # The least-squares fit over every id seen is biased by the tail's singletons, but it ranks skews.
    low, high = scaling_model.synthetic_refit(1.05, 100_000, 200_000), scaling_model.synthetic_refit(1.2, 100_000, 200_000)
    assert 0.6 < low < high < 1.4


def test_the_model_prints_hot_row_columns(tmp_path, generated_criteo):
    figures = scaling_model.plan_figures(scaling_model.config_shape("criteo_capped"), 2, 4096)
    records = [{"benchmark": "step_breakdown", "mode": "horovod", "rank": rank, "world_size": 2, "global_batch_size": 4096,
                "ms": {"dense_forward_backward": 1000.0, "exchange": 100.0, "allreduce": 10.0, "lookup": 5.0, "update": 5.0},
                "bytes_per_step": traffic.to_dict()} for rank, traffic in enumerate(figures["traffic"])]
    path = tmp_path / "breakdown.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records))
    out = scaling_model.main([f"--rates={path}", "--world_sizes=2,64", "--batch_sizes=32768", "--zipf_exponents=1.2",
                              f"--criteo_sample={generated_criteo.tsv}"])
    rows = [r for r in out if r["benchmark"] == "scaling_model"]
    assert [r["world_size"] for r in rows] == [2, 64]
    for row in rows:
        for choice in ("with_hot_rows", "with_hot_rows_seen_n_times"):
            hot = row[choice]["zipf_1.2"]
            assert 0 < hot["expected_hit_rate"] < 1 and hot["hot_rows"] > 0
            # The ratio is against the plan's own alltoall bytes (the model counts them the same way).
            assert hot["exchange_ratio"] == pytest.approx(hot["exchange_bytes_per_step"] / row["alltoall_bytes_sent_per_rank_per_step"], abs=1e-4)
    two, sixty_four = rows
    assert two["with_hot_rows"]["zipf_1.2"]["exchange_ratio"] < 0.5  # replication pays at 2 ranks
    # At 64 ranks every rank must receive every touched hot row: the budget's hottest cost more than
    # they save, the rows seen N times per step still save.
    assert sixty_four["with_hot_rows"]["zipf_1.2"]["exchange_ratio"] > 1
    assert sixty_four["with_hot_rows_seen_n_times"]["zipf_1.2"]["exchange_ratio"] < 1
    assert "criteo_sample_fit" in two["with_hot_rows"]
