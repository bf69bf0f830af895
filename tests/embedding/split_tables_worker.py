"""Run under horovodrun: split bf16 tables vs a float32 master-weight reference (``--split_embedding_tables``).

Usage: ``horovodrun -np N python tests/embedding/split_tables_worker.py CASES.json OUT_DIR``.

Three DLRMs under ``mixed_bfloat16``, same seed, same batches, each case's optimizers:

- ``split``: N ranks, model-parallel shards stored as split bf16 tables (the code under test);
- ``reference_n``: N ranks, the same plan, float32 shards whose lookups read the weights *truncated*
  to bfloat16 (:class:`TruncatingEmbedding`, written here independently of
  :mod:`tf_dlrm.embedding.split_tables`), updated in float32 by the usual in-place update: the
  master-weight scheme split tables claim to equal without the master copy;
- ``reference_1``: the same float32 reference in one process on the global batch.

Each rank writes per case: the initial tables (split joined vs float32), the forward logits, and after
``steps`` steps the gathered full tables and MLP weights of ``split`` vs both references (absolute
differences, and relative to the path the reference's weights travelled).
"""

from __future__ import annotations

import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import equivalence_worker as equivalence  # noqa: E402
from arithmetic import relative_to_path  # noqa: E402
from tf_dlrm.parallel import collectives  # noqa: E402
from tf_dlrm.embedding import DistributedEmbedding  # noqa: E402
from tf_dlrm.parallel.env import DistributedEnv  # noqa: E402
from tf_dlrm.sharding.plan import TableSpec  # noqa: E402
from tf_dlrm.embedding.split_tables import read_float32  # noqa: E402
from tests.plan_layer import plan_layer  # noqa: E402
from tf_dlrm.sharding.planner import make_plan  # noqa: E402
from tf_dlrm.models.dlrm import DLRM  # noqa: E402
from tf_dlrm.optimizers.settings import LearningRateSchedule  # noqa: E402
from tf_dlrm.optimizers.settings import OptimizerConfig  # noqa: E402
from tf_dlrm.train.step import Trainer


def mlp_variables(model) -> list:
    """DLRM's bottom and top MLP weights (data-parallel, optimised by the dense optimizer)."""
    return [v for layer in (model.bottom_mlp, model.top_mlp) for v in layer.trainable_variables]


def truncated_bfloat16(values: tf.Tensor) -> tf.Tensor:
    """The upper 16 bits of float32 ``values`` as bfloat16: truncation toward zero."""
    bits = tf.bitcast(values, tf.uint32)
    return tf.bitcast(tf.cast(tf.bitwise.right_shift(bits, tf.constant(16, tf.uint32)), tf.uint16), tf.bfloat16)


@tf.custom_gradient
def read_truncated(values):
    """Forward: the truncated bf16 of float32 rows; backward: the bf16 gradient taken to float32 for
    the float32 table (what a float32 table read through a cast to bfloat16 gets)."""
    return truncated_bfloat16(values), lambda upstream: tf.cast(upstream, tf.float32)


class TruncatingEmbedding(DistributedEmbedding):
    """float32 model-parallel shards whose lookups read the weights truncated to bf16 (one-hot features:
    the pooled row is the looked-up row)."""

    def _shard_lookup(self, variable, entries, index_dtype, kernel, checks, dtype=None):
        return read_truncated(super()._shard_lookup(variable, entries, index_dtype, kernel, checks))


def make_model(case, plan, rank, embedding_class, **options):
    embedding = plan_layer(plan, rank=rank, seed=case["seed"], layer_class=embedding_class, **options)
    model = DLRM(embedding, num_numerical=equivalence.NUM_NUMERICAL, bottom_mlp_dims=[8, case["dim"]],
                 top_mlp_dims=[8, 4, 1], seed=case["seed"])
    return model


def plan_for(case, world_size):
    tables = [TableSpec(f"t{i}", rows, case["dim"]) for i, rows in enumerate(case["cardinalities"])]
    return make_plan(tables, world_size, case["strategy"], data_parallel_threshold=case["data_parallel_threshold"])


def full_tables(model, count):
    return [model.embedding.get_full_table(t) for t in range(count)]  # collective; None off rank 0


def mlp_weights(model):
    return [v.numpy().copy() for v in mlp_variables(model)]


def run_case(case, env):
    equivalence.FLOOR["value"] = 1e-3
    plan, plan_1 = plan_for(case, env.world_size), plan_for(case, 1)
    count = len(plan.tables)
    split = make_model(case, plan, env.rank, DistributedEmbedding, storage="split_bfloat16")
    reference_n = make_model(case, plan, env.rank, TruncatingEmbedding)
    reference_1 = make_model(case, plan_1, 0, TruncatingEmbedding)
    batches = equivalence.make_batches(case, case["steps"] + 1)
    for model, world in ((split, env), (reference_n, env), (reference_1, DistributedEnv())):
        model(equivalence.local_inputs(batches[0], model, world)[0])
    config = OptimizerConfig(
        LearningRateSchedule(case["learning_rate"]), optimizer=case["optimizer"], embedding_optimizer=case["embedding_optimizer"],
        dense_learning_rate=0.01 if case["optimizer"] != "sgd" else 0.0, adam_epsilon=case.get("adam_epsilon", 1e-8))
    trainers = [Trainer(split, env, config), Trainer(reference_n, env, config), Trainer(reference_1, DistributedEnv(), config)]
    for trainer in trainers[:2]:
        trainer.broadcast_initial_state()
    record = {"case": case["name"], "rank": env.rank,
              "split_variables": sum(1 for v in split.embedding.shard_variables if v.dtype == "bfloat16")}
    initial_split, initial_reference = full_tables(split, count), full_tables(reference_1, count)
    if env.is_chief:
        record["initial_tables_equal"] = all(np.array_equal(a, b) for a, b in zip(initial_split, initial_reference))

    features, _ = equivalence.local_inputs(batches[0], split, env)
    logits = collectives.allgather(env, split(features))
    logits_n = collectives.allgather(env, reference_n(equivalence.local_inputs(batches[0], reference_n, env)[0]))
    logits_1 = reference_1(equivalence.local_inputs(batches[0], reference_1, DistributedEnv())[0])
    record["forward_vs_reference_n"] = float(np.abs(logits.numpy() - logits_n.numpy()).max())
    record["forward_vs_reference_1"] = float(np.abs(logits.numpy() - logits_1.numpy()).max()) / max(1.0, float(np.abs(logits_1.numpy()).max()))

    before = full_tables(reference_1, count) + mlp_weights(reference_1)
    paths = [0.0] * len(before)
    for batch in batches[1:]:
        trainers[0].train_step(*equivalence.local_inputs(batch, split, env))
        trainers[1].train_step(*equivalence.local_inputs(batch, reference_n, env))
        trainers[2].train_step(*equivalence.local_inputs(batch, reference_1, DistributedEnv()))
        after = full_tables(reference_1, count) + mlp_weights(reference_1)
        paths = [p + float(np.abs(a - b).max(initial=0.0)) for p, a, b in zip(paths, after, before)]
        before = after
    tables, tables_n = full_tables(split, count), full_tables(reference_n, count)
    record["mlp_vs_reference_n"] = max(float(np.abs(a - b).max()) for a, b in zip(mlp_weights(split), mlp_weights(reference_n)))
    record["mlp_vs_path"] = max(relative_to_path(a, b, p) for a, b, p in zip(mlp_weights(split), before[count:], paths[count:]))
    if env.is_chief:
        record["tables_vs_reference_n"] = max(float(np.abs(a - b).max()) for a, b in zip(tables, tables_n))
        record["tables_vs_reference_1"] = max(float(np.abs(a - b).max()) for a, b in zip(tables, before[:count]))
        record["tables_vs_path"] = max(relative_to_path(a, b, p) for a, b, p in zip(tables, before[:count], paths[:count]))
        record["tables_magnitude"] = max(float(np.abs(b).max()) for b in before[:count])
        record["tables_moved"] = max(float(np.abs(a - b).max()) for a, b in zip(before[:count], initial_reference))
    # On every rank: each split shard's bf16 half is the truncation of its joined float32 weights, bit for bit.
    record["high_is_truncation"] = all(
        np.array_equal(tf.bitcast(tf.convert_to_tensor(v), tf.uint16).numpy(),
                       (tf.bitcast(read_float32(v), tf.uint32).numpy() >> 16).astype(np.uint16))
        for v in split.embedding.shard_variables if v.dtype == "bfloat16")
    record["paths"] = paths
    return record


if __name__ == "__main__":
    from tests.case_runs import run_cases_on_this_rank

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    run_cases_on_this_rank(run_case, inter_op_threads=1)
