"""The memory plan per rank (pure Python): hand-computed bytes, the budget refusal, sizes as flags."""

from __future__ import annotations

import pytest

from tf_dlrm.sharding.memory_plan import check_budget, parse_bytes, plan_memory, with_dense
from tf_dlrm.sharding.plan import TableSlice, ShardingPlan, TableSpec

# t0: 100 x 8 replicated; t1: 1000 x 8 on rank 0; t2: 500 x 16 split 8/8 over ranks 0 and 1.
PLAN = ShardingPlan(
    world_size=2, tables=[TableSpec("t0", 100, 8), TableSpec("t1", 1000, 8), TableSpec("t2", 500, 16)],
    strategy="column_wise", replicated=(0,),
    rank_slices=[[TableSlice(1, 0, 8), TableSlice(2, 0, 8)], [TableSlice(2, 8, 16)]],
)


def test_tables_state_and_hot_rows_per_rank_by_hand():
    sgd = plan_memory(PLAN)
    # rank 0: 1000*8 + 500*8 + replicated 100*8 = 12,800 values; rank 1: 500*8 + 800 = 4,800.
    assert [m.tables for m in sgd] == [12_800 * 4, 4_800 * 4]
    assert [m.optimizer_state for m in sgd] == [0, 0] and [m.hot_rows for m in sgd] == [0, 0]
    adam = plan_memory(PLAN, element_slots=2)
    assert [m.optimizer_state for m in adam] == [2 * 12_800 * 4, 2 * 4_800 * 4]
    # Row-wise: one value per row of every slice held (1000 + 500 + 100 on rank 0, 500 + 100 on rank 1).
    rowwise = plan_memory(PLAN, row_slots=1)
    assert [m.optimizer_state for m in rowwise] == [1_600 * 4, 600 * 4]
    # 10 hot rows of t1 and 4 of t2, whole rows on every rank, with lazy Adam's two slots.
    hot = plan_memory(PLAN, element_slots=2, hot_rows={1: 10, 2: 4})
    assert [m.hot_rows for m in hot] == [(10 * 8 + 4 * 16) * 3 * 4] * 2
    assert hot[0].total == hot[0].tables + hot[0].optimizer_state + hot[0].hot_rows
    # Bounded staleness keeps the merged values beside the replicas: twice the hot-row bytes.
    assert [m.hot_rows for m in plan_memory(PLAN, element_slots=2, hot_rows={1: 10, 2: 4}, hot_copies=2)] == \
        [2 * (10 * 8 + 4 * 16) * 3 * 4] * 2


def test_a_plan_over_budget_is_refused_with_the_numbers():
    memory = plan_memory(PLAN, element_slots=2)
    check_budget(memory, 0)  # no budget
    check_budget(memory, 153_600)  # rank 0 needs exactly 153,600 bytes
    with pytest.raises(ValueError, match=r"--memory_per_rank=150.00 KiB.*rank 0: 150.00 KiB \(tables 50.00 KiB, "
                                         r"optimizer state 100.00 KiB, hot rows 0 B\)") as refused:
        check_budget(memory, 153_599)
    assert "rank 1" not in str(refused.value)  # only the ranks over the budget


def test_the_dense_part_counts_against_the_budget():
    memory = with_dense(plan_memory(PLAN, element_slots=2), dense=1_000, dense_optimizer_state=2_000)
    assert memory[0].total == 153_600 + 3_000 and memory[1].total - memory[1].hot_rows - 3_000 == \
        memory[1].tables + memory[1].optimizer_state
    check_budget(memory, 156_600)
    with pytest.raises(ValueError, match=r"^--memory_per_rank=152.93 KiB: the sharding plan does not fit: rank 0: 152.93 "
                                         r"KiB \(tables 50.00 KiB, optimizer state 100.00 KiB, hot rows 0 B, dense weights "
                                         r"1000 B and their optimizer state 1.95 KiB\)"):
        check_budget(memory, 156_599)
    # Dense weights alone over the budget: the plan is not what to change.
    with pytest.raises(ValueError, match=r"the model does not fit: .* Its dense weights and their optimizer state alone "
                                         r"take more, on every rank whatever the plan"):
        check_budget(with_dense(memory, dense=100_000, dense_optimizer_state=200_000), 250_000)


@pytest.mark.parametrize("text, expected", [
    ("0", 0), ("", 0), ("1000", 1000), ("2GiB", 2 * 2**30), ("1.5 GiB", 3 * 2**29), ("800MB", 800 * 10**6),
    ("64k", 64 * 1024), ("3T", 3 * 2**40), (4096, 4096),
])
def test_sizes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["lots", "2XB", "-1GiB", "GiB"])
def test_bad_sizes_name_the_flag(text):
    with pytest.raises(ValueError, match=r"--memory_per_rank"):
        parse_bytes(text)
