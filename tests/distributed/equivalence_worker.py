"""Run under horovodrun: N-rank DLRM vs the single-process reference on the same data and seed.

Usage: ``horovodrun -np N python tests/distributed/equivalence_worker.py CASES.json OUT_DIR``.
For each case every rank writes the largest differences it saw into ``OUT_DIR/rank<r>.json``:

- ``initial_tables``: gathered full tables (on rank 0) vs the reference's initial tables;
- ``forward``: the global batch's logits (gathered) vs the reference's;
- ``pooled``: the global batch's pooled embeddings (gathered) vs the reference's;
- ``tables`` / ``mlp``: after ``steps`` steps (the case's ``embedding_optimizer`` and dense
  ``optimizer``, SGD by default), gathered full tables and MLP weights vs the reference's
  (absolute and relative differences);
- ``embedding_state`` / ``dense_state``: the embedding optimizer's state gathered in full-table
  layout, and the dense optimizer's variables, vs the reference's.
"""

from __future__ import annotations

import os

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

from tf_dlrm.distributed import collectives  # noqa: E402
from tf_dlrm.distributed import env as env_module  # noqa: E402
from tf_dlrm.distributed.embedding import DistributedEmbedding  # noqa: E402
from tf_dlrm.distributed.env import DistributedEnv  # noqa: E402
from tf_dlrm.distributed.plan import TableSpec  # noqa: E402
from tf_dlrm.distributed.planner import make_plan  # noqa: E402
from tf_dlrm.model.dlrm import DLRM  # noqa: E402
from tf_dlrm.model.embedding import EmbeddingBank  # noqa: E402
from tf_dlrm.train.schedule import LearningRateSchedule  # noqa: E402
from tf_dlrm.train.step import OptimizerConfig, Trainer  # noqa: E402

NUM_NUMERICAL = 5


def table_widths(case):
    return case.get("widths") or [case["dim"]] * len(case["cardinalities"])


def make_models(case, env):
    widths = table_widths(case)
    tables = [TableSpec(f"t{i}", rows, width) for i, (rows, width) in enumerate(zip(case["cardinalities"], widths))]
    plan = make_plan(
        tables, env.world_size, case["strategy"], data_parallel_threshold=case["data_parallel_threshold"],
        column_slice_threshold=case.get("column_slice_threshold"),
    )
    interaction = case.get("interaction", "dot")
    kwargs = dict(num_numerical=NUM_NUMERICAL, bottom_mlp_dims=[8, widths[0]], top_mlp_dims=[8, 4, 1], seed=case["seed"],
                  interaction=interaction)
    features = case.get("features")
    embedding = DistributedEmbedding(plan, rank=env.rank, seed=case["seed"], data_parallel_input=case["data_parallel_input"],
                                     features=features, deduplicate_exchange=case.get("deduplicate_exchange", False),
                                     hot_rows={t: case["hot_ids"] for t in plan.model_parallel} if case.get("hot_ids") else None)
    model = DLRM(embedding, **kwargs)
    model(local_inputs(make_batches(case, 1)[0], embedding, env)[:2])
    reference = DLRM(EmbeddingBank(case["cardinalities"], widths, seed=case["seed"], features=features), **kwargs)
    reference(reference_inputs(make_batches(case, 1)[0])[:2])
    return plan, model, reference


def feature_list(case):
    return case.get("features") or [{"name": f"t{i}", "table": f"t{i}"} for i in range(len(case["cardinalities"]))]


def make_batches(case, count):
    """Numpy batches; a feature's ids are ``[B]`` (one-hot), ``[B, h]`` (fixed) or
    ``(values, row lengths)`` (ragged, with empty rows)."""
    rng = np.random.default_rng(case["seed"] + 99)
    batches = []
    for _ in range(count):
        size = case["global_batch"]
        numerical = rng.random((size, NUM_NUMERICAL), dtype=np.float32)
        ids = []
        for feature in feature_list(case):
            rows = case["cardinalities"][int(feature["table"][1:])]
            # Few distinct ids so that rows repeat within a sample and a batch (duplicate sparse updates).
            distinct = min(rows, 6)
            hotness = feature.get("hotness", 1)
            if feature.get("ragged"):
                lengths = rng.integers(0, hotness + 1, size)
                ids.append((rng.integers(0, distinct, int(lengths.sum())).astype(np.int32), lengths))
            elif hotness == 1:
                ids.append(rng.integers(0, distinct, size).astype(np.int32))
            else:
                ids.append(rng.integers(0, distinct, (size, hotness)).astype(np.int32))
        label = rng.integers(0, 2, (size, 1)).astype(np.float32)
        batches.append((numerical, ids, label))
    return batches


def as_tensor(ids, rows=None):
    """Rows ``rows`` (a slice; all when None) of one feature's numpy ids as a tensor."""
    if isinstance(ids, tuple):
        values, lengths = ids
        ragged = tf.RaggedTensor.from_row_lengths(values, lengths)
        return ragged[rows] if rows is not None else ragged
    return tf.constant(ids[rows] if rows is not None else ids)


def reference_inputs(batch):
    numerical, ids, label = batch
    return numerical, tuple(as_tensor(i) for i in ids), label


def local_inputs(batch, embedding, env):
    numerical, ids, label = batch
    local = numerical.shape[0] // env.world_size
    rows = slice(env.rank * local, (env.rank + 1) * local)
    categorical = [as_tensor(ids[t]) for t in embedding.global_categorical] + [as_tensor(ids[t], rows) for t in embedding.local_categorical]
    return numerical[rows], tuple(categorical), label[rows]


FLOOR = {"value": 1e-3}  # set per case: see test_equivalence.py


def max_differences(actual, expected):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    absolute = np.abs(actual - expected)
    relative = absolute / np.maximum(np.abs(expected), FLOOR["value"])
    return {"abs": float(absolute.max(initial=0.0)), "rel": float(relative.max(initial=0.0))}


def worst(first, second):
    return {k: max(first[k], second[k]) for k in first}


def gathered_tables_diff(model, reference, plan):
    result = {"abs": 0.0, "rel": 0.0}
    for table in range(len(plan.tables)):
        full = model.embedding.get_full_table(table)
        if full is not None:
            result = worst(result, max_differences(full, reference.embedding.get_full_table(table)))
    return result


def embedding_state_diff(model, trainer, reference, reference_trainer, plan):
    """Every slot of every table, gathered in full-table layout (collective), vs the reference's."""
    result = {"abs": 0.0, "rel": 0.0}
    for name in trainer.sparse.slot_names:
        for table in range(len(plan.tables)):
            full = model.embedding.get_full_table(table, lambda v: trainer.sparse.slot(v, name), trainer.sparse.row_wise)
            expected = reference.embedding.get_full_table(table, lambda v: reference_trainer.sparse.slot(v, name))
            if full is not None:
                result = worst(result, max_differences(full, expected))
    return result


def run_case(case, env):
    FLOOR["value"] = case.get("magnitude_floor", 1e-3)
    plan, model, reference = make_models(case, env)
    config = OptimizerConfig(
        LearningRateSchedule(case["learning_rate"], warmup_steps=case.get("warmup_steps", 0)),
        optimizer=case.get("optimizer", "sgd"), embedding_optimizer=case.get("embedding_optimizer", "sgd"),
        dense_learning_rate=case.get("dense_learning_rate", 0.0), embedding_weight_decay=case.get("embedding_weight_decay", 0.0),
        dense_weight_decay=case.get("dense_weight_decay", 0.0), adam_epsilon=case.get("adam_epsilon", 1e-8),
    )
    trainer = Trainer(model, env, config)
    trainer.broadcast_initial_state()
    reference_trainer = Trainer(reference, DistributedEnv(), config)
    batches = make_batches(case, case["steps"] + 1)
    initial = [reference.embedding.get_full_table(t) for t in range(len(plan.tables))]
    record = {"case": case["name"], "rank": env.rank, "rank_slices": [str(s) for s in plan.rank_slices[env.rank]]}
    record["initial_tables"] = gathered_tables_diff(model, reference, plan)

    numerical, categorical, _ = local_inputs(batches[0], model.embedding, env)
    logits = collectives.allgather(env, model((numerical, categorical)))
    reference_numerical, reference_categorical, _ = reference_inputs(batches[0])
    expected = reference((reference_numerical, reference_categorical))
    record["forward"] = max_differences(logits.numpy(), expected.numpy())
    pooled = collectives.allgather(env, model.embedding(categorical, local_batch=numerical.shape[0]))
    record["pooled"] = max_differences(pooled.numpy(), reference.embedding(reference_categorical).numpy())

    for batch in batches[1:]:
        trainer.train_step(*local_inputs(batch, model.embedding, env))
        reference_trainer.train_step(*reference_inputs(batch))
    record["tables"] = gathered_tables_diff(model, reference, plan)
    mlp = {"abs": 0.0, "rel": 0.0}
    for mine, theirs in zip(trainer.mlp, reference_trainer.mlp):
        mlp = worst(mlp, max_differences(mine.numpy(), theirs.numpy()))
    record["mlp"] = mlp
    record["embedding_state"] = embedding_state_diff(model, trainer, reference, reference_trainer, plan)
    dense_state = {"abs": 0.0, "rel": 0.0}
    for mine, theirs in zip(trainer.dense_optimizer.variables, reference_trainer.dense_optimizer.variables):
        dense_state = worst(dense_state, max_differences(mine.numpy(), theirs.numpy()))
    record["dense_state"] = dense_state
    record["state_slots"] = list(trainer.sparse.slot_names)
    record["hot_variables"] = len(trainer.hot)
    # The weights must have moved, or a no-op update would "match" too.
    record["tables_moved"] = max(
        float(np.abs(reference.embedding.get_full_table(t) - initial[t]).max()) for t in range(len(plan.tables))
    )
    return record


if __name__ == "__main__":
    from tests.case_runs import run_cases_on_this_rank

    run_cases_on_this_rank(run_case, inter_op_threads=int(os.environ.get("EQ_INTER", "1")))
