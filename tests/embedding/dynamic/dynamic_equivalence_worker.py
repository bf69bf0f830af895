"""Run under horovodrun: an N-rank DLRM on dynamic tables vs one process on the same keys and seed.

Usage: ``horovodrun -np N python tests/embedding/dynamic/dynamic_equivalence_worker.py CASES.json OUT_DIR``.
The reference is one process holding ``reference_shards`` shards ("world": N shards, the same
row-wise ownership and so the same per-shard capacity and evictions; 1: one plain table, for cases
whose capacity never fills). Every rank writes ``OUT_DIR/rank<r>.json`` with, per case:

- ``forward``: logits of a fresh evaluation batch (seen and unseen keys) after training, gathered;
- ``tables`` / ``embedding_state``: every live (table, key)'s row and optimizer state, gathered
  from all ranks, vs the reference's (``same_keys``: the two key sets are identical);
- ``mlp``: MLP weights; ``counters``: evictions / rejections / rows, summed over ranks, both runs;
- ``rows_per_step``: the reference's live rows after each step (insertions in every step).
"""

from __future__ import annotations

import os

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

from tf_dlrm.parallel import collectives  # noqa: E402
from tf_dlrm.parallel.env import DistributedEnv  # noqa: E402
from tf_dlrm.embedding import DistributedEmbedding  # noqa: E402
from tf_dlrm.embedding.table_config import DynamicStorage, FeatureConfig, Placement, TableConfig  # noqa: E402
from tf_dlrm.models.dlrm import DLRM  # noqa: E402
from tf_dlrm.optimizers.settings import LearningRateSchedule  # noqa: E402
from tf_dlrm.optimizers.settings import OptimizerConfig  # noqa: E402
from tf_dlrm.train.step import Trainer

NUM_NUMERICAL = 4


def dynamic_features(tables) -> list[FeatureConfig]:
    """One feature per dynamic table of the case (``{"name", "capacity", "width", ...}``, ``hotness`` and ``combiner``
    for a multi-hot one), named like it."""
    features = []
    for table in tables:
        storage = DynamicStorage(capacity=table["capacity"], eviction=table.get("eviction", "none"),
                                 min_count=table.get("min_count", 1), capacity_scope=table.get("capacity_scope", "per_rank"),
                                 max_idle_steps=table.get("max_idle_steps"))
        config = TableConfig(table["name"], table["capacity"], table["width"], placement=Placement(dynamic=storage))
        features.append(FeatureConfig(table["name"], config, hotness=table.get("hotness", 1),
                                      combiner=table.get("combiner", "sum")))
    return features


def make_model(case, env, shards):
    """DLRM on an embedding of dynamic tables only; its inner :class:`DynamicEmbedding` is
    ``model.embedding.dynamic_layer`` (``shards``: its shards, default one per rank)."""
    embedding = DistributedEmbedding(dynamic_features(case["tables"]), seed=case["seed"], env=env, dynamic_shards=shards,
                                     name="embedding")
    width = case["tables"][0]["width"]
    return DLRM(embedding, num_numerical=NUM_NUMERICAL, bottom_mlp_dims=[8, width], top_mlp_dims=[8, 1], seed=case["seed"])


def make_batches(case, count):
    """Global batches ``(numerical, {table name: keys}, label)`` of raw int64 keys over the whole range
    (negative ones too): each step draws from a pool that grows by ``new_keys_per_step`` fresh keys,
    more often the recent ones."""
    rng = np.random.default_rng(case["seed"] + 7)
    size, tables = case["global_batch"], len(case["tables"])
    pools = [list(rng.integers(-2**63, 2**63 - 1, case["new_keys_per_step"], dtype=np.int64)) for _ in range(tables)]
    batches = []
    for _ in range(count):
        keys = []
        for pool, table in zip(pools, case["tables"]):
            pool.extend(rng.integers(-2**63, 2**63 - 1, case["new_keys_per_step"], dtype=np.int64))
            weights = np.arange(1, len(pool) + 1, dtype=np.float64) ** 2
            shape = (size, table["hotness"]) if table.get("hotness", 1) > 1 else size
            keys.append(np.asarray(pool, np.int64)[rng.choice(len(pool), shape, p=weights / weights.sum())])
        numerical = rng.random((size, NUM_NUMERICAL), dtype=np.float32)
        label = rng.integers(0, 2, (size, 1)).astype(np.float32)
        batches.append((numerical, dict(zip([t["name"] for t in case["tables"]], keys)), label))
    return batches


def local(batch, env):
    """``(features, label)`` of this rank's rows: every feature's keys are read for the local batch."""
    numerical, keys, label = batch
    b = numerical.shape[0] // env.world_size
    rows = slice(env.rank * b, (env.rank + 1) * b)
    return {"numerical": numerical[rows], **{name: tf.constant(k[rows]) for name, k in keys.items()}}, label[rows]


def whole(batch):
    numerical, keys, label = batch
    return {"numerical": numerical, **{name: tf.constant(k) for name, k in keys.items()}}, label


def max_abs(actual, expected) -> float:
    return float(np.max(np.abs(np.asarray(actual, np.float64) - np.asarray(expected, np.float64)), initial=0.0))


def compare_rows(env, model, reference, state_of=None, reference_state_of=None) -> dict:
    """Gathers every rank's (key, values) per table; the max difference to the reference, by key."""
    worst, same = 0.0, True
    layer, reference_layer = model.embedding.dynamic_layer, reference.embedding.dynamic_layer
    for table in range(len(layer.table_configs)):
        keys, values = layer.local_rows(table, state_of)
        keys = collectives.allgather(env, tf.constant(keys, tf.int64), name=f"keys_{table}").numpy()
        values = collectives.allgather(env, tf.constant(values, tf.float32), name=f"values_{table}").numpy()
        expected_keys, expected = reference_layer.local_rows(table, reference_state_of)
        order, expected_order = np.argsort(keys), np.argsort(expected_keys)
        if not np.array_equal(keys[order], expected_keys[expected_order]):
            same = False
            continue
        worst = max(worst, max_abs(values[order], expected[expected_order]))
    return {"abs": worst, "same_keys": same}


def summed_counters(env, embedding) -> dict:
    counters = embedding.dynamic_layer.counters()
    names = sorted(counters)
    flat = np.array([[counters[n]["evictions"], counters[n]["rejections"], counters[n]["rows"]] for n in names], np.int64)
    total = collectives.sum_over_ranks(env, tf.constant(flat), name="dynamic_counters").numpy()
    return {n: dict(zip(("evictions", "rejections", "rows"), map(int, row))) for n, row in zip(names, total)}


def run_case(case, env):
    shards = env.world_size if case["reference_shards"] == "world" else int(case["reference_shards"])
    model = make_model(case, env, None)
    reference = make_model(case, DistributedEnv(), shards)
    batches = make_batches(case, case["steps"] + 1)
    model(local(batches[0], env)[0])
    reference(whole(batches[0])[0])
    config = OptimizerConfig(LearningRateSchedule(case["learning_rate"]), optimizer="sgd",
                             embedding_optimizer=case["embedding_optimizer"])
    trainer = Trainer(model, env, config)
    trainer.broadcast_initial_state()
    reference_trainer = Trainer(reference, DistributedEnv(), config)
    rows_per_step = []
    for batch in batches[:-1]:
        trainer.train_step(*local(batch, env))
        reference_trainer.train_step(*whole(batch))
        rows_per_step.append(sum(c["rows"] for c in reference.embedding.dynamic_layer.counters().values()))
    record = {"case": case["name"], "rank": env.rank, "rows_per_step": rows_per_step}
    features, _ = local(batches[-1], env)
    logits = collectives.allgather(env, model(features, training=False), name="logits").numpy()
    reference_features, _ = whole(batches[-1])
    record["forward"] = max_abs(logits, reference(reference_features, training=False).numpy())
    record["tables"] = compare_rows(env, model, reference)
    states = {}
    for name in trainer.sparse.slot_names:
        states[name] = compare_rows(env, model, reference, lambda v, n=name: trainer.sparse.slot(v, n),
                                    lambda v, n=name: reference_trainer.sparse.slot(v, n))
    record["embedding_state"] = states
    record["mlp"] = max(max_abs(a.numpy(), b.numpy()) for a, b in zip(trainer.mlp, reference_trainer.mlp))
    record["counters"] = summed_counters(env, model.embedding)
    record["reference_counters"] = reference.embedding.dynamic_layer.counters()
    return record


if __name__ == "__main__":
    from tests.case_runs import run_cases_on_this_rank

    run_cases_on_this_rank(run_case)
