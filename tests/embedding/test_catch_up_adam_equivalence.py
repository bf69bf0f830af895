"""N Horovod ranks train the same DLRM as one process with the Adam variants of the table-optimizer
study (``catch_up_adam``, ``dense_adam``): tables, MLP weights and both optimizers' state match.

The cases are :mod:`test_equivalence`'s stateful ones (4 steps with a warmup, Adam on the MLPs,
table-wise, column-wise and row bands, hot rows) with these optimizers, run by the same worker in one launch per
world size; the tolerances are that module's, derived there (only the order of float32 sums differs
between the runs). ``catch_up_adam``'s ``last_step`` slot is per element like its moments, so a column
slice carries its own copy and the state comparison covers it.
"""

from __future__ import annotations

import pytest

from conftest import CaseLaunches
from test_equivalence import BASE, HOT, ROWS, STATEFUL, WORKER, reference_writer

OPTIMIZERS = ("catch_up_adam", "dense_adam")
COMMON = {"optimizer": "adam", "dense_learning_rate": 0.01, "adam_epsilon": 1e-4, "magnitude_floor": BASE["learning_rate"]}
CASES = [{**STATEFUL, **COMMON, "name": f"{optimizer}_{strategy}", "strategy": strategy, "embedding_optimizer": optimizer}
         for optimizer in OPTIMIZERS for strategy in ("table_wise", "column_wise")]
CASES += [{**HOT, **COMMON, "name": f"hot_catch_up_adam_{strategy}", "strategy": strategy, "embedding_optimizer": "catch_up_adam"}
          for strategy in ("table_wise", "column_wise")]
# Row bands (every model-parallel table cut into N bands over the ranks): each band keeps its own rows' state.
CASES += [{**ROWS, **COMMON, "name": f"rows_{optimizer}", "embedding_optimizer": optimizer} for optimizer in OPTIMIZERS]
SLOTS = {"catch_up_adam": ["m", "v", "last_step"], "dense_adam": ["m", "v"]}
LAUNCHES = CaseLaunches(WORKER, CASES, world_sizes=(2, 3), env={"HOROVOD_CYCLE_TIME": "5"}, prepare=reference_writer(CASES))


@pytest.mark.multirank
@pytest.mark.parametrize("world_size", LAUNCHES.world_sizes)
def test_n_ranks_equal_one_process(world_size, tmp_path_factory):
    records = LAUNCHES.records(world_size, tmp_path_factory)
    assert sorted({r["case"] for r in records}) == sorted(c["name"] for c in CASES)
    for record in records:
        where = f"{record['case']} at N={world_size}, rank {record['rank']} owning {record['rank_slices']}"
        case = next(c for c in CASES if c["name"] == record["case"])
        assert record["forward"]["abs"] <= 1e-6, f"{where}: forward differs {record['forward']}"
        assert record["tables"]["rel"] <= 1e-5, f"{where}: tables differ {record['tables']}"
        assert record["mlp"]["rel"] <= 1e-5, f"{where}: MLP weights differ {record['mlp']}"
        assert record["embedding_state"]["rel"] <= 1e-5, f"{where}: embedding optimizer state differs {record['embedding_state']}"
        assert record["tables_moved"] > 1e-4, f"{where}: training did not change the tables"
        assert record["state_slots"] == SLOTS[case["embedding_optimizer"]], where

