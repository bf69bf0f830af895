"""Run under horovodrun: N-rank DLRM vs the single-process reference on the same data and seed.

Usage: ``horovodrun -np N python tests/embedding/equivalence_worker.py CASES.json OUT_DIR``.
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

import hashlib
import json
import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

from tf_dlrm.parallel import collectives  # noqa: E402
from tf_dlrm.embedding import DistributedEmbedding  # noqa: E402
from tf_dlrm.parallel.env import DistributedEnv  # noqa: E402
from tf_dlrm.sharding.plan import TableSpec  # noqa: E402
from tf_dlrm.sharding.planner import make_plan  # noqa: E402
from tests.plan_layer import plan_layer  # noqa: E402
from tf_dlrm.models.dlrm import DLRM  # noqa: E402
from tf_dlrm.embedding.embedding_bank import EmbeddingBank  # noqa: E402
from tf_dlrm.embedding.row_frequency import COUNT_SLOT  # noqa: E402
from tf_dlrm.optimizers.settings import LearningRateSchedule  # noqa: E402
from tf_dlrm.optimizers.settings import OptimizerConfig  # noqa: E402
from tf_dlrm.spec.format import NUMERICAL_CHANNEL  # noqa: E402
from tf_dlrm.train.step import Trainer

NUM_NUMERICAL = 5


def table_widths(case):
    return case.get("widths") or [case["dim"]] * len(case["cardinalities"])


def model_kwargs(case):
    widths = table_widths(case)
    return dict(num_numerical=NUM_NUMERICAL, bottom_mlp_dims=[8, widths[0]], top_mlp_dims=[8, 4, 1], seed=case["seed"],
                interaction=case.get("interaction", "dot"))


def make_model(case, env):
    widths = table_widths(case)
    tables = [TableSpec(f"t{i}", rows, width) for i, (rows, width) in enumerate(zip(case["cardinalities"], widths))]
    plan = make_plan(
        tables, env.world_size, case["strategy"], data_parallel_threshold=case["data_parallel_threshold"],
        column_slice_threshold=case.get("column_slice_threshold"), row_slice_threshold=case.get("row_slice_threshold"),
        placements=case.get("placements"),
    )
    embedding = plan_layer(plan, rank=env.rank, seed=case["seed"], data_parallel_input=case["data_parallel_input"],
                           features=case.get("features"), deduplicate_exchange=case.get("deduplicate_exchange", False),
                           hot_rows={t: hot_ids(case, t) for t in plan.model_parallel} if case.get("hot_ids") else None,
                           frequency_regularizer=case.get("frequency_regularizer"))
    model = DLRM(embedding, **model_kwargs(case))
    model.build(None)  # from the widths (DLRM.build): no eager forward with its collectives
    return plan, model


def id_choices(case, table: int) -> np.ndarray:
    """The few distinct ids of a table's features (see :func:`make_batches`)."""
    rows = case["cardinalities"][table]
    distinct = min(rows, 6)
    return np.linspace(0, rows - 1, distinct).astype(np.int32) if case.get("spread_ids") else np.arange(distinct, dtype=np.int32)


def hot_ids(case, table: int) -> list[int]:
    """The case's hot rows of ``table``: its ``hot_ids``, or ``"spread"``: every other id of the table's choices
    (in every row band)."""
    return [int(i) for i in id_choices(case, table)[::2]] if case["hot_ids"] == "spread" else case["hot_ids"]


def make_models(case, env):
    """The distributed model of ``case`` on this rank and its one-process reference, side by side."""
    plan, model = make_model(case, env)
    return plan, model, make_reference(case)


def make_reference(case):
    widths = table_widths(case)
    reference = DLRM(EmbeddingBank(case["cardinalities"], widths, seed=case["seed"], features=case.get("features"),
                                   frequency_regularizer=case.get("frequency_regularizer")),
                     **model_kwargs(case))
    reference.build(None)
    return reference


def feature_list(case):
    return case.get("features") or [{"name": f"t{i}", "table": f"t{i}"} for i in range(len(case["cardinalities"]))]


def make_batches(case, count):
    """Numpy batches ``(numerical, {feature name: ids}, label)``, the ids in feature order; a feature's ids
    are ``[B]`` (one-hot), ``[B, h]`` (fixed) or ``(values, row lengths)`` (ragged, with empty rows)."""
    rng = np.random.default_rng(case["seed"] + 99)
    batches = []
    for _ in range(count):
        size = case["global_batch"]
        numerical = rng.random((size, NUM_NUMERICAL), dtype=np.float32)
        ids = {}
        for feature in feature_list(case):
            # Few distinct ids so that rows repeat within a sample and a batch (duplicate sparse updates);
            # spread over the table's rows (every row band) when the case cuts tables into bands.
            choices = id_choices(case, int(feature["table"][1:]))
            distinct = choices.size
            hotness = feature.get("hotness", 1)
            if feature.get("ragged"):
                lengths = rng.integers(0, hotness + 1, size)
                ids[feature["name"]] = (choices[rng.integers(0, distinct, int(lengths.sum()))], lengths)
            elif hotness == 1:
                ids[feature["name"]] = choices[rng.integers(0, distinct, size)]
            else:
                ids[feature["name"]] = choices[rng.integers(0, distinct, (size, hotness))]
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
    """``(features, label)`` of the whole batch: the one-process reference reads every feature."""
    numerical, ids, label = batch
    return {NUMERICAL_CHANNEL: numerical, **{name: as_tensor(i) for name, i in ids.items()}}, label


def local_inputs(batch, model, env):
    """``(features, label)`` of this rank: the local rows of the numerical features and labels, and the
    ids ``model`` (a model or an embedding layer) reads by its ``input_modes``: for the global batch or
    for the local rows."""
    numerical, ids, label = batch
    local = numerical.shape[0] // env.world_size
    rows = slice(env.rank * local, (env.rank + 1) * local)
    features = {NUMERICAL_CHANNEL: numerical[rows]}
    for name, mode in model.input_modes.items():
        if name != NUMERICAL_CHANNEL:
            features[name] = as_tensor(ids[name]) if mode == "global" else as_tensor(ids[name], rows)
    return features, label[rows]


def reference_pooled(reference, features):
    """The reference bank's pooled embeddings, stacked in feature order."""
    return reference.embedding({f.name: features[f.name] for f in reference.embedding.features}, stacked=True)


FLOOR = {"value": 1e-3}  # set per case: see test_equivalence.py


def max_differences(actual, expected):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    absolute = np.abs(actual - expected)
    relative = absolute / np.maximum(np.abs(expected), FLOOR["value"])
    return {"abs": float(absolute.max(initial=0.0)), "rel": float(relative.max(initial=0.0))}


def worst(first, second):
    return {k: max(first[k], second[k]) for k in first}


def optimizer_config(case):
    return OptimizerConfig(
        LearningRateSchedule(case["learning_rate"], warmup_steps=case.get("warmup_steps", 0)),
        optimizer=case.get("optimizer", "sgd"), embedding_optimizer=case.get("embedding_optimizer", "sgd"),
        dense_learning_rate=case.get("dense_learning_rate", 0.0), embedding_weight_decay=case.get("embedding_weight_decay", 0.0),
        dense_weight_decay=case.get("dense_weight_decay", 0.0), adam_epsilon=case.get("adam_epsilon", 1e-8),
    )


def compute_reference(case) -> dict[str, np.ndarray]:
    """The one-process run of ``case``: what every world size is compared with, as named arrays."""
    reference = make_reference(case)
    trainer = Trainer(reference, DistributedEnv(), optimizer_config(case))
    batches = make_batches(case, case["steps"] + 1)
    tables = range(len(case["cardinalities"]))
    arrays = {f"initial_{t}": reference.embedding.get_full_table(t) for t in tables}
    features, _ = reference_inputs(batches[0])
    arrays["logits"] = reference(features).numpy()
    arrays["pooled"] = reference_pooled(reference, features).numpy()
    for batch in batches[1:]:
        trainer.train_step(*reference_inputs(batch))
    arrays.update({f"table_{t}": reference.embedding.get_full_table(t) for t in tables})
    arrays.update({f"mlp_{i}": v.numpy() for i, v in enumerate(trainer.mlp)})
    for name in trainer.sparse.slot_names:
        arrays.update({f"state_{name}_{t}": reference.embedding.get_full_table(t, lambda v: trainer.sparse.slot(v, name))
                       for t in tables})
    if trainer.sparse.row_counts is not None:  # the frequency regularizer's counts
        arrays.update({f"count_{t}": reference.embedding.get_full_table(t, lambda v: trainer.sparse.slot(v, COUNT_SLOT))
                       for t in tables})
    arrays.update({f"dense_{i}": v.numpy() for i, v in enumerate(trainer.dense_optimizer.variables)})
    return arrays


def reference_path(case, directory) -> str:
    key = hashlib.sha256(json.dumps(case, sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(directory, f"{case['name']}-{key}.npz")


def write_references(cases_path, directory) -> None:
    """``python equivalence_worker.py --reference CASES_JSON DIR``: the one-process run of every case
    not yet in ``DIR``. It does not depend on N, so one process computes it for every world size
    (each of N oversubscribed ranks computing it again was most of a launch's time)."""
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    os.makedirs(directory, exist_ok=True)
    with open(cases_path) as handle:
        for case in json.load(handle):
            path = reference_path(case, directory)
            if not os.path.exists(path):
                partial = f"{path}.{os.getpid()}.npz"
                np.savez(partial, **compute_reference(case))
                os.replace(partial, path)


def reference_of(case, directory) -> dict[str, np.ndarray]:
    with np.load(reference_path(case, directory)) as data:
        return {name: data[name] for name in data.files}


def gathered_tables_diff(model, expected, prefix):
    result = {"abs": 0.0, "rel": 0.0}
    for table in range(len(model.embedding.plan.tables)):
        full = model.embedding.get_full_table(table)
        if full is not None:
            result = worst(result, max_differences(full, expected[f"{prefix}_{table}"]))
    return result


def embedding_state_diff(model, trainer, expected):
    """Every slot of every table, gathered in full-table layout (collective), vs the reference's."""
    result = {"abs": 0.0, "rel": 0.0}
    for name in trainer.sparse.slot_names:
        for table in range(len(model.embedding.plan.tables)):
            full = model.embedding.get_full_table(table, lambda v: trainer.sparse.slot(v, name), trainer.sparse.row_wise)
            if full is not None:
                result = worst(result, max_differences(full, expected[f"state_{name}_{table}"]))
    return result


def counts_diff(model, trainer, expected):
    """The frequency regularizer's row counts (one column per row, a copy in every slice) vs the reference's."""
    result = {"abs": 0.0, "rel": 0.0}
    for table in range(len(model.embedding.plan.tables)):
        full = model.embedding.get_full_table(table, lambda v: trainer.sparse.slot(v, COUNT_SLOT), True)
        if full is not None:
            result = worst(result, max_differences(full, expected[f"count_{table}"]))
    return result


def list_diff(mine, expected, prefix):
    result = {"abs": 0.0, "rel": 0.0}
    for i, variable in enumerate(mine):
        result = worst(result, max_differences(variable.numpy(), expected[f"{prefix}_{i}"]))
    return result


def assembly_ops(step, inputs) -> list[str]:
    """The assembly kernel's op types in the traced training step (its gradient lives in the library)."""
    graph_def = step.get_concrete_function(*inputs).graph.as_graph_def()
    nodes = list(graph_def.node) + [node for f in graph_def.library.function for node in f.node_def]
    return sorted({node.op for node in nodes if node.op.startswith("TfDlrmAssembleColumns")})


def run_case(case, env):
    FLOOR["value"] = case.get("magnitude_floor", 1e-3)
    expected = reference_of(case, os.environ["EQUIVALENCE_REFERENCE_DIR"])
    plan, model = make_model(case, env)
    trainer = Trainer(model, env, optimizer_config(case))
    trainer.broadcast_initial_state()
    batches = make_batches(case, case["steps"] + 1)
    record = {"case": case["name"], "rank": env.rank, "rank_slices": [str(s) for s in plan.rank_slices[env.rank]]}
    record["initial_tables"] = gathered_tables_diff(model, expected, "initial")

    features, _ = local_inputs(batches[0], model, env)
    logits = collectives.allgather(env, model(features))
    record["forward"] = max_differences(logits.numpy(), expected["logits"])
    local_batch = features[NUMERICAL_CHANNEL].shape[0]
    pooled = collectives.allgather(env, model.embedding(features, local_batch=local_batch, stacked=True))
    record["pooled"] = max_differences(pooled.numpy(), expected["pooled"])

    for batch in batches[1:]:
        trainer.train_step(*local_inputs(batch, model, env))
    record["exchanges"] = model.embedding.exchanges
    record["assembly_ops"] = assembly_ops(trainer.train_step, local_inputs(batches[-1], model, env))
    record["tables"] = gathered_tables_diff(model, expected, "table")
    record["mlp"] = list_diff(trainer.mlp, expected, "mlp")
    record["embedding_state"] = embedding_state_diff(model, trainer, expected)
    record["dense_state"] = list_diff(trainer.dense_optimizer.variables, expected, "dense")
    record["state_slots"] = list(trainer.sparse.slot_names)
    record["hot_variables"] = len(trainer.hot)
    if trainer.sparse.row_counts is not None:
        record["counts"] = counts_diff(model, trainer, expected)
        record["most_seen"] = max(float(expected[f"count_{t}"].max()) for t in range(len(plan.tables)))
    # The weights must have moved, or a no-op update would "match" too.
    tables = range(len(plan.tables))
    record["tables_moved"] = max(float(np.abs(expected[f"table_{t}"] - expected[f"initial_{t}"]).max()) for t in tables)
    return record


if __name__ == "__main__" and sys.argv[1] == "--reference":
    write_references(sys.argv[2], sys.argv[3])
elif __name__ == "__main__":
    from tests.case_runs import run_cases_on_this_rank

    run_cases_on_this_rank(run_case, inter_op_threads=int(os.environ.get("EQ_INTER", "1")))
