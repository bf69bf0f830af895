"""DCNv2, DeepFM and Wide & Deep: N Horovod ranks train the same model as one process.

The reference is the same model class on a one-process plan. Tolerances as in
test_equivalence.py (same batch of 24 samples, same float32 sums in a different order): forward
and pooled embeddings within 1e-6 absolute; after 3 SGD steps (or 3 lazy Adam / Adam steps,
relative to max(|expected|, learning rate) for the reason given there) tables and dense weights
within rtol 1e-5. Each world size is one horovodrun launch running its cases
(:class:`conftest.CaseLaunches`).
"""

from __future__ import annotations


import pytest

from conftest import CaseLaunches

BASE = {"seed": 5, "global_batch": 24, "steps": 3, "learning_rate": 0.1, "data_parallel_threshold": 100,
        "cardinalities": [50, 300, 500, 1000], "dim": 7}
CROSSED = [["t1", "t2", 200], ["t0", "t3", 400]]
CASES = [
    {**BASE, "name": "dcnv2_stacked_table_wise", "strategy": "table_wise", "family": {"model": "dcnv2", "num_cross_layers": 2, "deep_mlp_dims": [8]}},
    {**BASE, "name": "dcnv2_parallel_low_rank_column_wise", "strategy": "column_wise", "data_parallel_input": True,
     "family": {"model": "dcnv2", "num_cross_layers": 2, "cross_low_rank": 3, "cross_structure": "parallel", "deep_mlp_dims": [8]}},
    # Layer normalization is per sample, so it keeps the equivalence (dropout, whose masks differ per rank, stays
    # at its default 0 in every case).
    {**BASE, "name": "deepfm_table_wise", "strategy": "table_wise",
     "family": {"model": "deepfm", "deep_mlp_dims": [8, 6], "deep_mlp_layer_norm": True}},
    {**BASE, "name": "deepfm_column_wise", "strategy": "column_wise", "family": {"model": "deepfm", "deep_mlp_dims": [8]}},
    {**BASE, "name": "wide_deep_table_wise", "strategy": "table_wise", "crossed": CROSSED, "family": {"model": "wide_deep", "deep_mlp_dims": [8]}},
    {**BASE, "name": "wide_deep_column_wise_lazy_adam", "strategy": "column_wise", "crossed": CROSSED,
     "family": {"model": "wide_deep", "deep_mlp_dims": [8]}, "embedding_optimizer": "lazy_adam", "optimizer": "adam",
     "dense_learning_rate": 0.01, "adam_epsilon": 1e-4, "magnitude_floor": BASE["learning_rate"]},
    # The wide tables with their own optimizer (FTRL), the deep ones with row-wise Adagrad.
    {**BASE, "name": "wide_deep_column_wise_ftrl_wide", "strategy": "column_wise", "crossed": CROSSED,
     "family": {"model": "wide_deep", "deep_mlp_dims": [8], "wide_optimizer": "ftrl", "wide_learning_rate": 0.05},
     "embedding_optimizer": "rowwise_adagrad", "magnitude_floor": BASE["learning_rate"]},
]
# At 4 ranks (the costliest launch on 2 cores): one case of each family, table-wise leaving a rank
# empty or column-wise cut in 4; the others at N = 2 and N = 3.
for _case in CASES:
    if _case["name"] not in ("dcnv2_stacked_table_wise", "deepfm_column_wise", "wide_deep_column_wise_ftrl_wide"):
        _case["world_sizes"] = (2, 3)
LAUNCHES = CaseLaunches("tests/models/model_family_worker.py", CASES)


@pytest.mark.multirank
@pytest.mark.parametrize("world_size,case", LAUNCHES.params())
def test_model_on_n_ranks_equals_one_process(world_size, case, tmp_path_factory):
    records = LAUNCHES.records(world_size, tmp_path_factory, case)
    assert len(records) == world_size
    for record in records:
        where = f"{case} at N={world_size}, rank {record['rank']} owning {record['rank_slices']}"
        assert record["initial_tables"]["abs"] == 0.0, f"{where}: initial tables depend on the sharding"
        assert record["forward"]["abs"] <= 1e-6, f"{where}: forward differs {record['forward']}"
        assert record["pooled"]["abs"] <= 1e-6, f"{where}: pooled embeddings differ {record['pooled']}"
        assert record["tables"]["rel"] <= 1e-5, f"{where}: tables after 3 steps differ {record['tables']}"
        assert record["dense"]["rel"] <= 1e-5, f"{where}: dense weights after 3 steps differ {record['dense']}"
        assert record["tables_moved"] > 1e-4, f"{where}: training did not change the tables"
        if "ftrl" in case:
            assert record["embedding_state"]["rel"] <= 1e-5, f"{where}: embedding optimizer state differs {record['embedding_state']}"
            assert record["state_entries"] == ["accumulator"] * 4 + ["accumulator"] * 6 + ["linear"] * 6
        if "dcnv2" not in case:
            assert record["narrow_tables_moved"] > 1e-4, f"{where}: the width-1 tables did not train"
    if "wide_deep" in case:
        assert {"cross:t1*t2", "cross:t0*t3", "linear:t0"} <= set(records[0]["table_names"])
