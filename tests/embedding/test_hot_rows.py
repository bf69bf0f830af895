"""Hot-row planner: hand-computed choices under a byte budget, hit rates, bad input named."""

import numpy as np
import pytest

from tf_dlrm.sharding.hot_rows import plan_hot_rows
from tf_dlrm.sharding.plan import TableSpec
from tf_dlrm.sharding.planner import make_plan


def _plan(world_size=2, strategy="table_wise"):
    tables = [TableSpec("big", 4000, 4), TableSpec("wide", 3000, 8), TableSpec("small", 10, 4)]
    return make_plan(tables, world_size, strategy)


def _counts():
    big = np.zeros(4000, np.int64)
    big[[7, 9, 100]] = [50, 30, 1]          # 12.5, 7.5, 0.25 lookups per byte (4 values x 4 bytes)
    wide = np.zeros(3000, np.int64)
    wide[[0, 5]] = [160, 32]                # 5.0, 1.0 lookups per byte (8 x 4 bytes)
    return [big, wide, np.ones(10, np.int64)]


def test_greedy_by_lookups_per_byte_hand_computed():
    plan = _plan()
    total = (4000 * 4 + 3000 * 8) * 4                       # model-parallel bytes: 160,000
    budget = (16 + 16 + 32) / total                          # exactly rows 7, 9 of big and 0 of wide
    hot = plan_hot_rows(plan, _counts(), budget)
    assert hot.for_table(0) == (7, 9) and hot.for_table(1) == (0,) and hot.for_table(2) == ()
    assert hot.hot_bytes == 64 and hot.budget_bytes == 64
    assert hot.tables[0].hit_rate == pytest.approx(80 / 81)
    assert hot.tables[1].hit_rate == pytest.approx(160 / 192)
    assert hot.overall_hit_rate == pytest.approx(240 / 273)
    text = hot.describe()
    assert "table 0 (big): 2 hot rows, expected hit rate 0.9877" in text
    assert "table 1 (wide): 1 hot rows, expected hit rate 0.8333" in text


def test_budget_one_takes_every_occurring_row_and_zero_none():
    plan = _plan(strategy="column_wise")
    everything = plan_hot_rows(plan, _counts(), 1.0)
    assert everything.for_table(0) == (7, 9, 100) and everything.for_table(1) == (0, 5)
    assert everything.overall_hit_rate == 1.0
    nothing = plan_hot_rows(plan, _counts(), 0.0)
    assert nothing.tables == () and nothing.overall_hit_rate == 0.0


def test_zipf_counts_reach_high_hit_rate_in_small_budget():
    rng = np.random.default_rng(0)
    rows = 100000
    plan = make_plan([TableSpec("t0", rows, 16), TableSpec("t1", rows, 16)], 2, "table_wise")
    probabilities = (np.arange(rows) + 1.0) ** -1.2
    probabilities /= probabilities.sum()
    counts = [np.bincount(rng.choice(rows, 200000, p=probabilities), minlength=rows) for _ in range(2)]
    hot = plan_hot_rows(plan, counts, 0.05)
    assert hot.hot_bytes <= hot.budget_bytes
    assert hot.overall_hit_rate > 0.8


@pytest.mark.parametrize("budget", [-0.1, 1.5, "0.1", None])
def test_bad_budget_is_named(budget):
    with pytest.raises(ValueError, match="hot_rows_budget"):
        plan_hot_rows(_plan(), _counts(), budget)


def test_counts_of_wrong_size_name_the_table():
    counts = _counts()
    counts[1] = counts[1][:-1]
    with pytest.raises(ValueError, match=r"table 1 \('wide'\).*\(3000,\)"):
        plan_hot_rows(_plan(), counts, 0.1)
    with pytest.raises(ValueError, match="counts for 3 tables"):
        plan_hot_rows(_plan(), counts[:2], 0.1)


def test_hot_rows_module_imports_no_framework():
    import os
    import pathlib
    import subprocess
    import sys
    root = pathlib.Path(__file__).resolve().parents[2]
    code = ("import sys, tf_dlrm.sharding.hot_rows; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'horovod', 'keras'}))")
    result = subprocess.run([sys.executable, "-c", code], cwd=root, env=dict(os.environ, PYTHONPATH=str(root)),
                            capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_min_count_keeps_rarely_seen_rows_cold():
    plan = _plan(strategy="column_wise")
    # Budget for everything, but rows counted fewer than 32 times stay cold: big's 100 (1) and 9 (30).
    hot = plan_hot_rows(plan, _counts(), 1.0, min_count=32)
    assert hot.for_table(0) == (7,) and hot.for_table(1) == (0, 5)
    assert hot.tables[0].hit_rate == pytest.approx(50 / 81)


def test_min_count_for_is_world_size_lookups_per_batch():
    # 1,000,000 samples in batches of 16384: a row seen 2 times per batch occurs 122.07 times -> 123.
    from tf_dlrm.sharding.hot_rows import min_count_for

    assert min_count_for(2, 1_000_000, 16384) == 123
    assert min_count_for(1, 100, 100) == 1
    with pytest.raises(ValueError, match="world_size, samples and global_batch_size"):
        min_count_for(2, 0, 16384)


@pytest.mark.parametrize("min_count", [0, -1, 1.5, True])
def test_bad_min_count_is_named(min_count):
    with pytest.raises(ValueError, match="min_count"):
        plan_hot_rows(_plan(), _counts(), 0.5, min_count=min_count)
