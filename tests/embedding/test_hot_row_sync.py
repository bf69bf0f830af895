"""``--hot_row_sync_every=S``: hot-row replicas updated locally, merged every S steps (tf_dlrm/embedding/hot_row_sync.py).

One ``horovodrun`` launch per world size (2 and 3) runs every case of :data:`CASES`
(``tests/embedding/hot_row_sync_worker.py`` says what each measures). Rows 0, 2 and 4 of every
model-parallel table are hot and ids are drawn from 0..5, so about half the lookups are hot and
every rank touches hot rows in every step.

Tolerances: the merged replicas are compared with float32 references that add the same terms in
another order or round one more time (``delta = replica - base`` is rounded once, and the reference's
``-lr / N * g`` is computed by numpy, not by the scatter): a few unit roundoffs (6e-8) of the table
values (|w| < 0.5 here) per step, so 1e-6 after at most 8 steps; the exact path and the merge at
``S = 1`` differ in the same roundings, fed back through the next steps' forward. The merge itself
adds the same float32 terms in the same order on every rank: replicas and state are identical (0.0).
"""

from __future__ import annotations

import os

import pytest

from conftest import REPO, launch_cases, make_synthetic_small

BASE = {"seed": 3, "global_batch": 24, "learning_rate": 0.1, "data_parallel_threshold": 100, "data_parallel_input": False,
        "cardinalities": [50, 300, 500, 1000], "dim": 7, "hot_ids": [0, 2, 4]}
CASES = [
    {**BASE, "name": f"exact_vs_merge_{strategy}", "kind": "exact_vs_merge", "strategy": strategy, "steps": 4}
    for strategy in ("table_wise", "column_wise")
] + [
    {**BASE, "name": f"reference_{strategy}_every_{every}", "kind": "reference", "strategy": strategy, "every": every,
     "steps": 2 * every}
    for strategy, every in (("table_wise", 4), ("column_wise", 3))
] + [
    {**BASE, "name": f"state_merge_{optimizer}_{strategy}", "kind": "state_merge", "strategy": strategy, "steps": 3,
     "embedding_optimizer": optimizer}
    for optimizer, strategy in (("adagrad", "table_wise"), ("rowwise_adagrad", "table_wise"), ("lazy_adam", "column_wise"),
                                ("ftrl", "table_wise"))
]
STATE_SLOTS = {"adagrad": 1, "rowwise_adagrad": 1, "lazy_adam": 2, "ftrl": 2}
WORLD_SIZES = (2, 3)
# The optimizer states merge by one rule whatever the optimizer: at 3 ranks one of them, at 2 all four.
for _case in CASES:
    if _case["kind"] == "state_merge" and _case["embedding_optimizer"] != "rowwise_adagrad":
        _case["world_sizes"] = (2,)
_results: dict[int, list[dict]] = {}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_synthetic_small(tmp_path_factory.mktemp("hot_sync_data"), seed=1, num_train=24_000, num_valid=2_400)


def checkpoint_case(dataset, directory, world_size):
    flags = [f"--dataset_path={dataset}", "--hot_rows_budget=0.1", "--hot_row_sync_every=4", "--batch_size=1200",
             "--embedding_dim=8", "--bottom_mlp_dims=16,8", "--top_mlp_dims=16,1", "--seed=7",
             "--embedding_optimizer=adagrad", f"--save_checkpoint_path={os.path.join(str(directory), 'checkpoints')}"]
    return {"name": "checkpoint", "kind": "checkpoint", "steps": 2, "argv": flags}


def results_for(world_size, tmp_path_factory, dataset) -> list[dict]:
    if world_size not in _results:
        directory = tmp_path_factory.mktemp(f"hot_sync_np{world_size}")
        cases = [c for c in CASES if world_size in c.get("world_sizes", WORLD_SIZES)] + [
            checkpoint_case(dataset, directory, world_size)]
        _results[world_size] = launch_cases(world_size, os.path.join(REPO, "tests/embedding/hot_row_sync_worker.py"),
                                            cases, directory)
    return _results[world_size]


def records_of(world_size, name, tmp_path_factory, dataset):
    records = [r for r in results_for(world_size, tmp_path_factory, dataset) if r["case"] == name]
    assert len(records) == world_size
    return records


@pytest.mark.multirank
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("strategy", ["table_wise", "column_wise"])
def test_merging_after_every_step_equals_the_exact_combine_for_sgd(world_size, strategy, tmp_path_factory, dataset):
    for record in records_of(world_size, f"exact_vs_merge_{strategy}", tmp_path_factory, dataset):
        where = f"N={world_size} rank {record['rank']}"
        assert record["initial_mlp"] == 0.0, where
        assert record["merges"] == 4, where
        assert record["hot"] <= 1e-6, f"{where}: replicas differ from the exact path by {record['hot']}"
        assert record["tables"] <= 1e-6 and record["mlp"] <= 1e-6, f"{where}: {record}"
        assert record["ranks_spread"] == 0.0, f"{where}: ranks' replicas differ after a merge"


@pytest.mark.multirank
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("name", [c["name"] for c in CASES if c["kind"] == "reference"])
def test_merged_sgd_replica_is_base_plus_every_ranks_local_deltas(world_size, name, tmp_path_factory, dataset):
    every = next(c["every"] for c in CASES if c["name"] == name)
    for record in records_of(world_size, name, tmp_path_factory, dataset):
        where = f"{name} N={world_size} rank {record['rank']}"
        # Never more than S steps without a merge; merged at S and 2S.
        assert record["steps_since_merge"] == [(s % every) for s in range(1, 2 * every + 1)], where
        assert record["merges"][-1] == 2, where
        assert min(record["drift_before_merge"]) > 0.0, f"{where}: replicas did not drift between merges"
        assert record["moved"] > 1e-3, f"{where}: training did not move the hot rows"
        assert record["merged_vs_reference"] <= 1e-6, f"{where}: {record['merged_vs_reference']}"
        assert record["ranks_spread"] == 0.0, f"{where}: ranks' replicas differ after the merge"
        assert record["bytes_sent"] > 0, where


@pytest.mark.multirank
@pytest.mark.parametrize("world_size,name", [(n, c["name"]) for c in CASES if c["kind"] == "state_merge"
                                             for n in c.get("world_sizes", WORLD_SIZES)])
def test_stateful_optimizer_state_merges_like_the_rows(world_size, name, tmp_path_factory, dataset):
    optimizer = next(c["embedding_optimizer"] for c in CASES if c["name"] == name)
    for record in records_of(world_size, name, tmp_path_factory, dataset):
        where = f"{name} N={world_size} rank {record['rank']}"
        assert record["state_variables"] == STATE_SLOTS[optimizer] * 3, where  # 3 model-parallel tables
        assert record["drift_before_merge"] > 0.0, where
        assert record["merged_vs_reference"] <= 1e-6, f"{where}: {record['merged_vs_reference']}"
        assert record["ranks_spread"] == 0.0 and record["bases_equal_replicas"] == 0.0, where
        assert record["steps_since_merge"] == 0, where


@pytest.mark.multirank
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_checkpoint_saves_the_merged_replicas(world_size, tmp_path_factory, dataset):
    for record in records_of(world_size, "checkpoint", tmp_path_factory, dataset):
        where = f"N={world_size} rank {record['rank']}"
        assert record["hot_tables"] > 0 and record["pending_steps_before_save"] == 2, where
        assert record["drift_before_save"] > 0.0, f"{where}: replicas did not drift before the save"
        assert record["saved_vs_replica"] == 0.0, f"{where}: the saved hot rows are not this rank's replicas"
        assert record["ranks_spread"] == 0.0 and record["steps_since_merge"] == 0, where


@pytest.mark.multirank
def test_main_logs_the_flag_and_merges(dataset, tmp_path):
    """main.py at -np 2: the flag in the config and hot_rows events, one merge per S steps, an AUC."""
    import json

    from conftest import launch

    log = tmp_path / "log.jsonl"
    launch(2, ["main.py", f"--dataset_path={dataset}", f"--log_path={log}", "--hot_rows_budget=0.1", "--hot_row_sync_every=4",
               "--batch_size=1200", "--epochs=1", "--embedding_dim=8", "--bottom_mlp_dims=16,8", "--top_mlp_dims=16,1",
               "--seed=7", "--print_freq=10"], timeout=600)
    events = [json.loads(line) for line in open(log)]
    (config,) = [e for e in events if e["event"] == "config"]
    (plan,) = [e for e in events if e["event"] == "hot_rows"]
    (measured,) = [e for e in events if e["event"] == "hot_rows_measured"]
    final = events[-1]
    assert config["hot_row_sync_every"] == 4 and plan["sync_every"] == 4
    assert final["steps"] == 20 and measured["merges"] == 5 and measured["hot_row_sync_every"] == 4, measured
    assert all(r["hot_gradient_bytes_sent"] > 0 for r in measured["ranks"])
    assert 0.5 < final["auc"] <= 1.0, final


def test_main_refuses_the_flag_with_one_rank():
    from conftest import run_python

    done = run_python(["main.py", "--dataset_path=/nowhere", "--hot_rows_budget=0.1", "--hot_row_sync_every=4"], check=False)
    assert done.returncode != 0 and "--hot_row_sync_every=4 needs several ranks" in done.stderr, done.stderr[-2000:]
