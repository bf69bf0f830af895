"""N Horovod ranks train the same DLRM as one process: outputs and updated weights match.

Each world size is one ``horovodrun`` launch running the cases of :data:`CASES` meant for it
(:class:`conftest.CaseLaunches`). Tolerances: forward
logits and pooled embeddings within 1e-6 absolute (sums of at most 5 float32 values of size
<= 1/sqrt(50) ~ 0.14 in a different order: error <= 5 * 2**-24 * 0.7 ~ 2e-7); after 3 SGD steps, gathered full tables and MLP weights within
rtol 1e-5 (relative to max(|expected|, 1e-3), so values near zero are held to 1e-8 absolute):
only the order of float32 sums differs between the runs. Derivation (tests/arithmetic.py): a float32
sum of n terms is within gamma_n ~ n * 2**-24 of the sum of the terms' absolute values; the longest
sums here are the weight gradients over the global batch of 24 samples (gamma_24 = 1.4e-6, at most
2.9e-6 between two orders), and 3 steps at learning rate 0.1 move a weight by a fraction of its size,
so 1e-5 holds on any CPU's kernels; the forward's sums are at most 16 terms (gamma = 9.5e-7 of logits
of order 1, hence 1e-6 absolute).
"""

from __future__ import annotations

import json

import pytest

from conftest import CaseLaunches, run_python

BASE = {"seed": 3, "global_batch": 24, "steps": 3, "learning_rate": 0.1, "data_parallel_threshold": 100}
CASES = [
    # A replicated table (50 rows) and three model-parallel ones; with 4 ranks table-wise leaves a rank empty.
    {**BASE, "name": "table_wise", "strategy": "table_wise", "data_parallel_input": False, "cardinalities": [50, 300, 500, 1000], "dim": 7},
    # dim 7 cut into 3 slices of widths 3, 2, 2 at N = 3.
    {**BASE, "name": "column_wise_odd_dim", "strategy": "column_wise", "data_parallel_input": False, "cardinalities": [50, 300, 500, 1000], "dim": 7},
    # Fewer model-parallel tables (2) than ranks: auto slices them so every rank owns something.
    {**BASE, "name": "auto_few_tables", "strategy": "auto", "data_parallel_input": False, "cardinalities": [400, 60, 900], "dim": 6},
    {**BASE, "name": "table_wise_dp_input", "strategy": "table_wise", "data_parallel_input": True, "cardinalities": [50, 300, 500, 1000], "dim": 7},
    {**BASE, "name": "column_wise_dp_input", "strategy": "column_wise", "data_parallel_input": True, "cardinalities": [50, 300, 500, 1000], "dim": 7},
    {**BASE, "name": "auto_sliced_dp_input", "strategy": "auto", "data_parallel_input": True, "cardinalities": [20, 3000, 150, 700], "dim": 5, "column_slice_threshold": 4000},
]
# Multi-hot: fixed and ragged (empty rows included), sum / mean / sqrtn, a replicated table (t0) read
# by two features, a model-parallel table (t2) shared by a one-hot and a multi-hot feature.
MULTI_HOT = [
    {"name": "a", "table": "t0", "hotness": 3, "combiner": "sum"},
    {"name": "b", "table": "t1", "hotness": 4, "combiner": "mean", "ragged": True},
    {"name": "c", "table": "t2"},
    {"name": "d", "table": "t3", "hotness": 5, "combiner": "sum", "ragged": True},
    {"name": "e", "table": "t2", "hotness": 2, "combiner": "sqrtn"},
    {"name": "f", "table": "t0", "hotness": 3, "combiner": "mean", "ragged": True},
]
MULTI_HOT_BASE = {**BASE, "cardinalities": [50, 300, 500, 1000], "features": MULTI_HOT}
# Mixed widths (cat interaction): dim 8 cut into 3 slices, odd widths elsewhere.
MIXED = {**MULTI_HOT_BASE, "widths": [4, 8, 6, 5], "dim": None, "interaction": "cat"}
CASES += [
    {**MULTI_HOT_BASE, "name": "multi_hot_table_wise", "strategy": "table_wise", "data_parallel_input": False, "dim": 7},
    {**MULTI_HOT_BASE, "name": "multi_hot_column_wise", "strategy": "column_wise", "data_parallel_input": False, "dim": 7},
    {**MULTI_HOT_BASE, "name": "multi_hot_table_wise_dp_input", "strategy": "table_wise", "data_parallel_input": True, "dim": 7},
    {**MULTI_HOT_BASE, "name": "multi_hot_column_wise_dp_input", "strategy": "column_wise", "data_parallel_input": True, "dim": 7},
    {**MIXED, "name": "mixed_widths_table_wise", "strategy": "table_wise", "data_parallel_input": False},
    {**MIXED, "name": "mixed_widths_column_wise_dp_input", "strategy": "column_wise", "data_parallel_input": True},
]
# The stateful cases (every embedding optimizer, LAMB/Adam, 4 steps): tables, MLP weights and both
# optimizers' state within the same rtol 1e-5; a few float32 unit roundoffs (6e-8) per step, amplified
# at most a few times by Adagrad's and Adam's 1/sqrt(state). They measure relative to max(|expected|, learning rate): Adam moves every touched
# weight by about the learning rate per step whatever its size, so a weight passing near zero carries
# the rounding of lr-sized steps (u * lr per step), not of its own size. Their Adam epsilon is 1e-4:
# with 1e-8, an entry of the averaged MLP gradient that cancels to ~1e-9 (random labels, 24 samples)
# steps by +-lr on the sign of its rounding noise, a property of Adam, not of the sharding (one
# process with the batch permuted shows the same).
# Every embedding optimizer, table-wise and column-wise (row-wise Adagrad across column slices is
# the hard one), with LAMB or Adam on the MLPs; 4 steps with a warmup, so the schedule moves too.
STATEFUL = {**BASE, "steps": 4, "warmup_steps": 2, "data_parallel_input": False, "cardinalities": [50, 300, 500, 1000], "dim": 7}
CASES += [
    {**STATEFUL, "name": f"{optimizer}_{strategy}", "strategy": strategy, "embedding_optimizer": optimizer,
     "optimizer": dense, "dense_learning_rate": 0.01, "adam_epsilon": 1e-4, "magnitude_floor": BASE["learning_rate"]}
    for optimizer, dense in (("adagrad", "lamb"), ("rowwise_adagrad", "lamb"), ("lazy_adam", "adam"))
    for strategy in ("table_wise", "column_wise")
] + [
    # Several slices of one table on one rank, ids exchanged, weight decay on both families.
    {**BASE, "name": "rowwise_adagrad_auto_sliced_dp_input", "strategy": "auto", "data_parallel_input": True,
     "cardinalities": [20, 3000, 150, 700], "dim": 5, "column_slice_threshold": 4000, "embedding_optimizer": "rowwise_adagrad",
     "optimizer": "lamb", "dense_learning_rate": 0.01, "embedding_weight_decay": 0.01, "dense_weight_decay": 0.01,
     "adam_epsilon": 1e-4, "magnitude_floor": BASE["learning_rate"]},
]
# FTRL, and the deduplicated exchange (--deduplicate_exchange) with every embedding optimizer,
# table-wise and column-wise: five tables, so that table-wise leaves no rank empty at N = 4 (the
# deduplicated exchange needs every rank to own a slice). Only the order of the float32 sums of
# duplicate samples' gradients changes (summed on the receiver before the backward alltoall), so the
# same tolerances hold.
DEDUP = {**STATEFUL, "cardinalities": [50, 300, 500, 1000, 700], "deduplicate_exchange": True}
CASES += [
    {**STATEFUL, "name": f"ftrl_{strategy}", "strategy": strategy, "embedding_optimizer": "ftrl", "optimizer": "adam",
     "dense_learning_rate": 0.01, "adam_epsilon": 1e-4, "magnitude_floor": BASE["learning_rate"]}
    for strategy in ("table_wise", "column_wise")
] + [
    {**DEDUP, "name": f"dedup_{optimizer}_{strategy}", "strategy": strategy, "embedding_optimizer": optimizer,
     "optimizer": dense, "dense_learning_rate": 0.01, "adam_epsilon": 1e-4, "magnitude_floor": BASE["learning_rate"]}
    for optimizer, dense in (("sgd", "sgd"), ("adagrad", "lamb"), ("rowwise_adagrad", "lamb"), ("lazy_adam", "adam"),
                             ("ftrl", "adam"))
    for strategy in ("table_wise", "column_wise")
]
# Hot-row replication (--hot_rows_budget): rows 0, 2 and 4 of every model-parallel table replicated on
# every rank, so about half the lookups are hot (ids are drawn from 0..5) and samples mix hot and
# cold; every embedding optimizer, table-wise and column-wise. The hot rows' gradients are summed per
# rank, then over ranks (another order of the same float32 sums): the same tolerances hold.
HOT = {**STATEFUL, "hot_ids": [0, 2, 4]}
CASES += [
    {**HOT, "name": f"hot_{optimizer}_{strategy}", "strategy": strategy, "embedding_optimizer": optimizer,
     "optimizer": dense, "dense_learning_rate": 0.01, "adam_epsilon": 1e-4, "magnitude_floor": BASE["learning_rate"]}
    for optimizer, dense in (("sgd", "sgd"), ("adagrad", "lamb"), ("rowwise_adagrad", "lamb"), ("lazy_adam", "adam"),
                             ("ftrl", "adam"))
    for strategy in ("table_wise", "column_wise")
]
# The frequency regularizer (rare ids): every row counts the steps that looked it up, is not updated
# before its second, and gets l2 * w / (count * batch) on its gradient; a replicated table (50 rows), table-wise
# and column-wise shards and hot rows. The counts are integers (exact in float32, compared exactly);
# the update adds one elementwise term per touched row, computed alike on every rank: the same tolerances hold.
FREQUENCY = {**STATEFUL, "frequency_regularizer": {"l2": 2.0, "min_count": 2}, "optimizer": "adam",
             "dense_learning_rate": 0.01, "adam_epsilon": 1e-4, "magnitude_floor": BASE["learning_rate"]}
CASES += [
    {**FREQUENCY, "name": f"frequency_{optimizer}_{strategy}", "strategy": strategy, "embedding_optimizer": optimizer}
    for optimizer, strategy in (("lazy_adam", "table_wise"), ("lazy_adam", "column_wise"), ("adagrad", "column_wise"))
] + [{**FREQUENCY, **HOT, "name": "frequency_hot_lazy_adam_column_wise", "strategy": "column_wise",
      "embedding_optimizer": "lazy_adam"}]
# Row bands (--row_slice_threshold, NVIDIA's rule: every model-parallel table of more than 1000 elements cut
# into N bands of rows): ids spread over every band, every embedding optimizer (each band updates its own
# rows; row-wise Adagrad's state is whole per row), multi-hot sum / mean / sqrtn (a band pools the ids in
# its rows, scaled by the whole sample's count: the bands' partial vectors add up on the receiver), ids
# exchanged, the frequency regularizer's counts, hot rows, and a grid (row bands of column slices: 2 x 2 at N = 4;
# at N = 2 and 3, a prime number of ranks, a grid is column slices). The receiver adds N partial sums in
# another order than one process's single sum: the forward's sums stay under 16 terms (1e-6 holds).
ROWS = {**STATEFUL, "row_slice_threshold": 1000, "spread_ids": True, "strategy": "table_wise", "optimizer": "adam",
        "dense_learning_rate": 0.01, "adam_epsilon": 1e-4, "magnitude_floor": BASE["learning_rate"]}
CASES += [
    {**ROWS, "name": f"rows_{optimizer}", "embedding_optimizer": optimizer}
    for optimizer in ("sgd", "adagrad", "rowwise_adagrad", "lazy_adam", "ftrl")
] + [
    {**ROWS, **MULTI_HOT_BASE, "name": "rows_multi_hot_dp_input", "row_slice_threshold": 1000, "spread_ids": True,
     "strategy": "table_wise", "data_parallel_input": True, "dim": 7, "steps": 4, "embedding_optimizer": "lazy_adam"},
    {**ROWS, "name": "rows_frequency_lazy_adam", "embedding_optimizer": "lazy_adam",
     "frequency_regularizer": {"l2": 2.0, "min_count": 2}},
    # Hot rows of row-sliced tables: a band's owner sends only its own cold rows, the receiver reads the hot ones
    # from its replica once (not once per band).
    {**ROWS, "name": "rows_hot_lazy_adam", "embedding_optimizer": "lazy_adam", "hot_ids": "spread"},
    {**ROWS, "name": "grid_adagrad", "row_slice_threshold": None, "placements": ["auto", "grid", "grid", "table_wise"],
     "embedding_optimizer": "adagrad"},
]
ROW_CASES = {c["name"] for c in CASES if c.get("row_slice_threshold") or c.get("placements")}
# Launches of 3 and 4 ranks on 2 cores cost the most, so not every case runs at every N. Every layout
# (an empty rank, odd 3-way and 4-way slices, auto slicing, multi-hot, mixed widths) runs at 2, 3 and 4.
# At N = 4, one case per stateful family (the hard one, row-wise Adagrad across column slices). At N = 3,
# every embedding optimizer's state across odd 3-way column slices (widths 3, 2, 2), one deduplicated
# and one hot-row exchange. Every optimizer meets every exchange, table-wise and column-wise, at N = 2.
AT_FOUR_RANKS = {"rowwise_adagrad_column_wise", "dedup_rowwise_adagrad_column_wise", "hot_lazy_adam_column_wise"} | ROW_CASES
AT_THREE_RANKS = AT_FOUR_RANKS | {"adagrad_column_wise", "lazy_adam_column_wise", "ftrl_column_wise",
                                  "rowwise_adagrad_auto_sliced_dp_input", "frequency_lazy_adam_column_wise",
                                  "frequency_hot_lazy_adam_column_wise"}
for _case in CASES:
    if "optimizer" in _case:
        _case["world_sizes"] = (2, 3, 4) if _case["name"] in AT_FOUR_RANKS else \
            (2, 3) if _case["name"] in AT_THREE_RANKS else (2,)
CASE_BY_NAME = {c["name"]: c for c in CASES}
WORKER = "tests/embedding/equivalence_worker.py"


def reference_writer(cases: list[dict]):
    """A :class:`conftest.CaseLaunches` ``prepare``: the one-process references of ``cases``, computed
    once (one process, ``equivalence_worker.py --reference``) and read by every rank of every world size."""
    def write(tmp_path_factory) -> dict:
        directory = tmp_path_factory.mktemp("equivalence_reference")
        cases_path = directory / "cases.json"
        cases_path.write_text(json.dumps(cases))
        run_python([WORKER, "--reference", str(cases_path), str(directory)], timeout=900)
        return {"EQUIVALENCE_REFERENCE_DIR": str(directory)}
    return write


# A 5 ms Horovod cycle (1 ms by default for models this small): the ranks' background threads
# coordinate less often while the others trace. It changes only when collectives start and what
# Horovod fuses, i.e. float32 sum orders (rtol 1e-5 above).
LAUNCHES = CaseLaunches(WORKER, CASES, env={"HOROVOD_CYCLE_TIME": "5"}, prepare=reference_writer(CASES))


@pytest.mark.multirank
@pytest.mark.parametrize("world_size,case", LAUNCHES.params())
def test_n_ranks_equal_one_process(world_size, case, tmp_path_factory):
    records = LAUNCHES.records(world_size, tmp_path_factory, case)
    assert len(records) == world_size
    for record in records:
        where = f"{case} at N={world_size}, rank {record['rank']} owning {record['rank_slices']}"
        assert record["initial_tables"]["abs"] == 0.0, f"{where}: initial tables depend on the sharding"
        assert record["forward"]["abs"] <= 1e-6, f"{where}: forward differs {record['forward']}"
        assert record["pooled"]["abs"] <= 1e-6, f"{where}: pooled embeddings differ {record['pooled']}"
        assert record["tables"]["rel"] <= 1e-5, f"{where}: tables after 3 steps differ {record['tables']}"
        assert record["mlp"]["rel"] <= 1e-5, f"{where}: MLP weights after 3 steps differ {record['mlp']}"
        assert record["embedding_state"]["rel"] <= 1e-5, f"{where}: embedding optimizer state differs {record['embedding_state']}"
        assert record["dense_state"]["rel"] <= 1e-5, f"{where}: dense optimizer state differs {record['dense_state']}"
        assert record["tables_moved"] > 1e-4, f"{where}: training did not change the tables"
        plain_exchange = not CASE_BY_NAME[case].get("hot_ids") and not CASE_BY_NAME[case].get("deduplicate_exchange") \
            and case not in ROW_CASES  # row bands are added up by TensorFlow's ops, not the assembly kernel
        if record["exchanges"] and plain_exchange:  # what arrives is put in feature order by the kernel, both ways
            assert record["assembly_ops"] == ["TfDlrmAssembleColumns", "TfDlrmAssembleColumnsGrad"], f"{where}: {record['assembly_ops']}"
        if CASE_BY_NAME[case].get("hot_ids"):  # the hot rows really are replicated and trained
            assert record["hot_variables"] > 0, f"{where}: no hot-row replicas"
        expected_slots = {"adagrad": ["accumulator"], "rowwise_adagrad": ["accumulator"], "lazy_adam": ["m", "v"],
                          "ftrl": ["accumulator", "linear"]}
        assert record["state_slots"] == expected_slots.get(CASE_BY_NAME[case].get("embedding_optimizer"), [])
        if CASE_BY_NAME[case].get("frequency_regularizer"):  # counted alike, and some row seen more than once
            assert record["counts"]["abs"] == 0.0, f"{where}: row counts differ {record['counts']}"
            assert record["most_seen"] >= 2, f"{where}: no row reached min_count"


@pytest.mark.multirank
@pytest.mark.parametrize("world_size", LAUNCHES.world_sizes)
def test_cases_cover_the_hard_layouts(world_size, tmp_path_factory):
    """The plans really contain an odd-width 3-way slice, an empty rank or a multi-slice table."""
    records = LAUNCHES.records(world_size, tmp_path_factory)
    column_wise = [r for r in records if r["case"] == "column_wise_odd_dim"]
    widths = sorted(len(r["rank_slices"]) for r in column_wise)
    assert all(w > 0 for w in widths)
    if world_size == 3:
        slices_of_table_1 = [s for r in column_wise for s in r["rank_slices"] if "table=1," in s]
        assert len(slices_of_table_1) == 3
    auto = [r for r in records if r["case"] == "auto_few_tables"]
    assert all(r["rank_slices"] for r in auto), "auto left a rank without any slice"
    # Every row case cuts its tables into N bands (a grid at N = 4: 2 bands of 2 column slices).
    for name in ROW_CASES:
        bands = {s.split("row_start=")[1].split(",")[0] for r in records if r["case"] == name for s in r["rank_slices"] if "table=2," in s}
        assert len(bands) == (2 if name.startswith("grid") and world_size == 4 else 1 if name.startswith("grid") else world_size), (name, bands)
