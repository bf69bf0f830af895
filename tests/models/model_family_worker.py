"""Run under horovodrun: DCNv2, DeepFM and Wide & Deep on N ranks vs the same model in one process.

Usage: ``horovodrun -np N python tests/models/model_family_worker.py CASES.json OUT_DIR``.
The reference is the same model class built on a one-process plan (every table whole and local);
the records are those of :mod:`equivalence_worker` (forward, pooled embeddings, gathered tables,
dense weights and optimizer state after a few steps).
"""

from __future__ import annotations

import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "embedding"))
from equivalence_worker import (  # noqa: E402
    FLOOR, NUM_NUMERICAL, local_inputs, make_batches, max_differences, reference_inputs, worst,
)

from tf_dlrm.spec.crossed_features import CrossedFeature  # noqa: E402
from tf_dlrm.embedding.table_config import FeatureConfig, TableConfig  # noqa: E402
from tf_dlrm.parallel import collectives  # noqa: E402
from tf_dlrm.parallel.env import DistributedEnv  # noqa: E402
from tf_dlrm.sharding.planner import make_plan  # noqa: E402
from tests.model_families import build_family_model  # noqa: E402
from tf_dlrm.optimizers.settings import LearningRateSchedule  # noqa: E402
from tf_dlrm.optimizers.settings import OptimizerConfig  # noqa: E402
from tf_dlrm.train.step import Trainer


def build(case, env, world_size, rank):
    base_tables = [TableConfig(f"t{i}", rows, case["dim"]) for i, rows in enumerate(case["cardinalities"])]
    crossed = [CrossedFeature(a, b, buckets) for a, b, buckets in case.get("crossed", [])]
    params = dict(case["family"])
    name = params.pop("model")

    def plan_of(tables):
        return make_plan(tables, world_size, case["strategy"] if world_size > 1 else "table_wise",
                         data_parallel_threshold=case["data_parallel_threshold"] if world_size > 1 else 0)

    features = [FeatureConfig(t.name, t.name) for t in base_tables]
    return build_family_model(name, params, base_tables, features, crossed, plan_of, NUM_NUMERICAL, rank, case["seed"],
                              data_parallel_input=case.get("data_parallel_input", False))


def run_case(case, env):
    FLOOR["value"] = case.get("magnitude_floor", 1e-3)
    plan, model = build(case, env, env.world_size, env.rank)
    _, reference = build(case, env, 1, 0)
    batches = make_batches(case, case["steps"] + 1)
    model(local_inputs(batches[0], model, env)[0])
    reference(reference_inputs(batches[0])[0])
    config = OptimizerConfig(
        LearningRateSchedule(case["learning_rate"]), optimizer=case.get("optimizer", "sgd"),
        embedding_optimizer=case.get("embedding_optimizer", "sgd"), dense_learning_rate=case.get("dense_learning_rate", 0.0),
        adam_epsilon=case.get("adam_epsilon", 1e-8),
    )
    trainer = Trainer(model, env, config)
    trainer.broadcast_initial_state()
    reference_trainer = Trainer(reference, DistributedEnv(), config)
    count = len(plan.tables)
    record = {"case": case["name"], "rank": env.rank, "rank_slices": [str(s) for s in plan.rank_slices[env.rank]],
              "table_names": [t.name for t in plan.tables]}

    def tables_diff():
        result = {"abs": 0.0, "rel": 0.0}
        for table in range(count):
            full = model.embedding.get_full_table(table)  # collective
            if full is not None:
                result = worst(result, max_differences(full, reference.embedding.get_full_table(table)))
        return result

    initial = [reference.embedding.get_full_table(t) for t in range(count)]
    record["initial_tables"] = tables_diff()
    features, _ = local_inputs(batches[0], model, env)
    logits = collectives.allgather(env, model(features))
    reference_features, _ = reference_inputs(batches[0])
    record["forward"] = max_differences(logits.numpy(), reference(reference_features).numpy())
    # The stacked embedding output, derived features included (made from this rank's columns).
    pooled = collectives.allgather(env, model.embed(features))
    record["pooled"] = max_differences(pooled.numpy(), reference.embed(reference_features).numpy())
    for batch in batches[1:]:
        trainer.train_step(*local_inputs(batch, model, env))
        reference_trainer.train_step(*reference_inputs(batch))
    record["tables"] = tables_diff()
    state = {"abs": 0.0, "rel": 0.0}
    entries = trainer.sparse.state_entries(count)
    assert entries == reference_trainer.sparse.state_entries(count)
    for slot, table in entries:
        row_wise = trainer.sparse.table_optimizer(table).row_wise
        full = model.embedding.get_full_table(table, lambda v: trainer.sparse.slot(v, slot, table), row_wise)  # collective
        expected = reference.embedding.get_full_table(table, lambda v: reference_trainer.sparse.slot(v, slot, table), row_wise)
        if full is not None:
            state = worst(state, max_differences(full, expected))
    record["embedding_state"] = state
    record["state_entries"] = [slot for slot, _ in entries]
    dense = {"abs": 0.0, "rel": 0.0}
    assert len(trainer.mlp) == len(reference_trainer.mlp)
    for mine, theirs in zip(trainer.mlp, reference_trainer.mlp):
        dense = worst(dense, max_differences(mine.numpy(), theirs.numpy()))
    record["dense"] = dense
    record["tables_moved"] = max(float(np.abs(reference.embedding.get_full_table(t) - initial[t]).max()) for t in range(count))
    # The width-1 tables alone moved too (first-order / wide weights are trained, not only carried).
    narrow = [t for t in range(count) if plan.tables[t].dim == 1]
    record["narrow_tables_moved"] = max([float(np.abs(reference.embedding.get_full_table(t) - initial[t]).max()) for t in narrow] or [0.0])
    return record


if __name__ == "__main__":
    from tests.case_runs import run_cases_on_this_rank

    run_cases_on_this_rank(run_case)
