"""benchmarks/hot_rows.py: byte counts on a small case (budget 0 sends the plain bytes; skew saves)."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _benchmark():
    spec = importlib.util.spec_from_file_location("hot_rows_benchmark", ROOT / "benchmarks" / "hot_rows.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_budget_zero_equals_plain_and_skew_saves_bytes():
    benchmark = _benchmark()
    common = ["--source=zipf:1.2", "--world_size=2", "--batch_size=512", "--batches=1", "--count_batches=4",
              "--dim=8", "--max_rows=50000"]
    (none,) = benchmark.main(common + ["--budget=0"])
    assert none["bytes_per_step_hot_rows"] == none["bytes_per_step_plain"] and none["measured_hit_rate"] == 0
    (some,) = benchmark.main(common + ["--budget=0.1"])
    assert some["hot_bytes"] <= some["budget_bytes"]
    assert 0.5 < some["measured_hit_rate"] <= 1 and some["ratio"] < 0.8
