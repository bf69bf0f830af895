"""N Horovod ranks training DLRM on dynamic tables equal one process (issue #16).

Keys are raw int64 over the whole range (negative ones included), and every step brings new keys
(insertions in every step, checked on the reference's row count). One ``horovodrun`` launch per
world size runs its cases (:class:`conftest.CaseLaunches`). Reference: one process holding one plain table (``reference_shards: 1``)
where capacity never fills; where it does (evictions, rejections, admission by count), one process
holding the same N shards (capacity and eviction are per shard, and a key's shard is fixed by its
hash, so this is the only single-process run that can take the same decisions).

Tolerances as tests/embedding/test_equivalence.py: logits within 1e-6 absolute (sums of at most
16 float32 terms of order 1: gamma_16 ~ 9.5e-7), rows, optimizer state and MLP weights within 1e-5
absolute after 4-5 steps (only the order of float32 sums differs: the exchange sums each key's
gradient over ranks before the shard's own deduplication, gamma_24 ~ 1.4e-6 per step of lr 0.1).
Key sets and eviction/rejection counts must be identical (integers).
"""

from __future__ import annotations


import pytest

from conftest import CaseLaunches

BASE = {"seed": 3, "global_batch": 24, "learning_rate": 0.1, "new_keys_per_step": 6}
TABLES = [{"name": "a", "capacity": 400, "width": 4}, {"name": "b", "capacity": 400, "width": 4}]
CASES = [
    {**BASE, "name": "insert_sgd", "steps": 4, "embedding_optimizer": "sgd", "reference_shards": 1, "tables": TABLES},
    {**BASE, "name": "insert_adagrad", "steps": 4, "embedding_optimizer": "adagrad", "reference_shards": 1, "tables": TABLES},
    {**BASE, "name": "insert_rowwise_adagrad", "steps": 4, "embedding_optimizer": "rowwise_adagrad", "reference_shards": 1,
     "tables": TABLES},
    # Small shards: evictions (LRU on a, LFU with admission after 2 sightings on b) and rejections.
    {**BASE, "name": "evict_lazy_adam", "steps": 5, "embedding_optimizer": "lazy_adam", "reference_shards": "world",
     "tables": [{"name": "a", "capacity": 6, "width": 4, "eviction": "lru"},
                {"name": "b", "capacity": 5, "width": 4, "eviction": "lfu", "min_count": 2}]},
    # Capacity in total (ceil(24 / N) rows per shard), LRU, Adagrad state evicted with the rows.
    {**BASE, "name": "evict_total_adagrad", "steps": 5, "embedding_optimizer": "adagrad", "reference_shards": "world",
     "tables": [{"name": "a", "capacity": 24, "width": 4, "eviction": "lru", "capacity_scope": "total"},
                {"name": "b", "capacity": 12, "width": 4, "eviction": "lfu", "capacity_scope": "total"}]},
    # Rows idle for 1 (a) or 2 (b) steps dropped: decided by each row's last use and the step, one plain table.
    {**BASE, "name": "idle_adagrad", "steps": 5, "embedding_optimizer": "adagrad", "reference_shards": 1,
     "tables": [{"name": "a", "capacity": 400, "width": 4, "max_idle_steps": 1},
                {"name": "b", "capacity": 400, "width": 4, "max_idle_steps": 2, "min_count": 2}]},
    # Multi-hot dynamic features (3 keys per sample, pooled by mean and sum), LRU evictions on small shards.
    {**BASE, "name": "evict_multi_hot_sgd", "steps": 4, "embedding_optimizer": "sgd", "reference_shards": "world",
     "tables": [{"name": "a", "capacity": 6, "width": 4, "eviction": "lru", "hotness": 3, "combiner": "mean"},
                {"name": "b", "capacity": 5, "width": 4, "eviction": "lfu", "hotness": 2}]},
]
# At 4 ranks (the costliest launch on 2 cores) one insertion case and the case whose per-shard
# capacity depends on N; every optimizer and eviction already runs at N = 2 and N = 3.
for _case in CASES:
    if _case["name"] not in ("insert_sgd", "evict_total_adagrad"):
        _case["world_sizes"] = (2, 3)
LAUNCHES = CaseLaunches("tests/embedding/dynamic/dynamic_equivalence_worker.py", CASES)


@pytest.mark.multirank
@pytest.mark.parametrize("world_size,case", LAUNCHES.params())
def test_dynamic_n_ranks_equal_one_process(world_size, case, tmp_path_factory):
    records = LAUNCHES.records(world_size, tmp_path_factory, case)
    assert len(records) == world_size
    for record in records:
        where = f"{case} at N={world_size}, rank {record['rank']}"
        assert record["forward"] <= 1e-6, f"{where}: logits differ by {record['forward']}"
        assert record["tables"]["same_keys"], f"{where}: the live keys differ from one process's"
        assert record["tables"]["abs"] <= 1e-5, f"{where}: rows differ by {record['tables']}"
        for slot, difference in record["embedding_state"].items():
            assert difference["same_keys"] and difference["abs"] <= 1e-5, f"{where}: optimizer state {slot} differs {difference}"
        assert record["mlp"] <= 1e-5, f"{where}: MLP weights differ by {record['mlp']}"
        assert record["counters"] == record["reference_counters"], f"{where}: counters differ"
        rows = record["rows_per_step"]
        if record["case"].startswith("insert"):
            assert all(b > a for a, b in zip(rows, rows[1:])), f"{where}: not an insertion in every step: {rows}"
        else:
            assert all(c["evictions"] > 0 for c in record["counters"].values()), f"{where}: no eviction {record['counters']}"
