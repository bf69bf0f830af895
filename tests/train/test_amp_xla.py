"""``--amp`` and ``--xla``: XLA equals the plain step, AMP learns as well as fp32, N ranks equal one.

Also the hand-written gradient of the dot interaction and float16 dynamic loss scaling.

This file doubles as the Horovod worker of the multi-rank test:
``horovodrun -np N python tests/train/test_amp_xla.py CASES.json OUT_DIR``.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from arithmetic import ARITHMETIC_PATHS  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL_FLAGS = [
    "--embedding_dim=16", "--bottom_mlp_dims=64,16", "--top_mlp_dims=64,32,1", "--batch_size=1024",
    "--learning_rate=1.0", "--epochs=2", "--print_freq=100", "--seed=7", "--optimizer=sgd", "--embedding_optimizer=sgd",
]


def mlp_variables(model) -> list:
    """DLRM's bottom and top MLP weights (data-parallel, optimised by the dense optimizer)."""
    return [v for layer in (model.bottom_mlp, model.top_mlp) for v in layer.trainable_variables]


def _policy(name):
    """Sets the Keras global policy; returns a callable that restores the previous one."""
    import keras

    previous = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy(name)
    return lambda: keras.mixed_precision.set_global_policy(previous)


def small_model(seed=5, cardinalities=(40, 3000, 500, 7000), dim=8, interaction="dot", policy="float32"):
    """A single-process DLRM with replicated and model-parallel tables, built under ``policy``."""
    from tf_dlrm.sharding.plan import TableSpec
    from tf_dlrm.sharding.planner import make_plan
    from tf_dlrm.models.dlrm import DLRM
    from tests.plan_layer import plan_layer
    from tf_dlrm.cli.builder import build_with_dummy_batch

    restore = _policy(policy)
    try:
        plan = make_plan([TableSpec(f"t{i}", rows, dim) for i, rows in enumerate(cardinalities)], 1, "auto",
                         data_parallel_threshold=100)
        embedding = plan_layer(plan, rank=0, seed=seed)
        model = DLRM(embedding, num_numerical=5, bottom_mlp_dims=[16, dim], top_mlp_dims=[16, 8, 1],
                     interaction=interaction, seed=seed)
        build_with_dummy_batch(model, 5, embedding, 1)
    finally:
        restore()
    return model


def batches_for(model, count, size=64, seed=0):
    """``(features, label)`` batches of the one-process ``model``: one feature per table, ids by name."""
    rng = np.random.default_rng(seed)
    embedding = model.embedding
    names = [f.name for f in embedding.features]
    out = []
    for _ in range(count):
        ids = [rng.integers(0, min(rows, 20), size).astype(np.int32) for rows in embedding.cardinalities]
        numerical = rng.random((size, 5), dtype=np.float32)
        out.append(({"numerical": numerical, **dict(zip(names, ids))}, rng.integers(0, 2, (size, 1)).astype(np.float32)))
    return out


# ---------------------------------------------------------------------- XLA


@pytest.mark.slow  # XLA compiles two models per case
@pytest.mark.parametrize(
    "interaction, embedding_optimizer, optimizer",
    [("dot", "sgd", "sgd"), ("cat", "sgd", "sgd"), ("dot", "rowwise_adagrad", "lamb"), ("dot", "lazy_adam", "lamb")],
)
def test_xla_step_equals_the_plain_step(interaction, embedding_optimizer, optimizer):
    from tf_dlrm.parallel.env import DistributedEnv
    from tf_dlrm.optimizers.settings import LearningRateSchedule
    from tf_dlrm.optimizers.settings import OptimizerConfig
    from tf_dlrm.train.step import Trainer

    rates = {} if optimizer == "sgd" else {"dense_learning_rate": 0.01, "embedding_learning_rate": 0.05}
    config = OptimizerConfig(LearningRateSchedule(0.5), optimizer=optimizer, embedding_optimizer=embedding_optimizer, **rates)
    plain, compiled = small_model(interaction=interaction), small_model(interaction=interaction)
    trainers = [Trainer(plain, DistributedEnv(), config), Trainer(compiled, DistributedEnv(), config, jit_compile=True)]
    batches = batches_for(plain, 4)
    # float32 with and without XLA: the same operations, sums fused and ordered differently. Each sum
    # of at most 64 terms (the batch) is within gamma_64 = 3.8e-6 of the sum of |terms| on either side
    # (tests/arithmetic.py); losses, logits and weights here are of order 1, hence 1e-5 absolute.
    for batch in batches[:3]:
        losses = [float(t.train_step(*batch).numpy()) for t in trainers]
        assert abs(losses[0] - losses[1]) <= 1e-5, losses
    logits = [m(batches[3][0]).numpy() for m in (plain, compiled)]
    np.testing.assert_allclose(logits[1], logits[0], rtol=0, atol=1e-5)
    for mine, theirs in zip(compiled.weights, plain.weights):
        np.testing.assert_allclose(np.asarray(mine), np.asarray(theirs), rtol=0, atol=1e-5, err_msg=mine.path)
    assert float(np.abs(np.asarray(plain.embedding.shard_variables[0]) -
                        np.asarray(small_model().embedding.shard_variables[0])).max()) > 1e-4, "nothing trained"


# ---------------------------------------------------------------------- interaction gradient


@pytest.mark.parametrize("include_diagonal", [False, True])
def test_dot_interaction_gradient_matches_autodiff(include_diagonal):
    import tensorflow as tf

    from tf_dlrm.models.layers.interaction import DotInteraction, lower_triangle_indices

    rng = np.random.default_rng(1)
    bottom = tf.constant(rng.normal(size=(3, 4)), tf.float32)
    embeddings = tf.constant(rng.normal(size=(3, 5, 4)), tf.float32)
    weights = tf.constant(rng.normal(size=(4 + len(lower_triangle_indices(6, include_diagonal)),)), tf.float32)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([bottom, embeddings])
        fast = tf.reduce_sum(DotInteraction(include_diagonal)((bottom, embeddings)) * weights)
        vectors = tf.concat([bottom[:, None], embeddings], axis=1)
        products = tf.reshape(tf.matmul(vectors, vectors, transpose_b=True), [3, 36])
        plain = tf.concat([bottom, tf.gather(products, lower_triangle_indices(6, include_diagonal), axis=1)], axis=1)
        plain = tf.reduce_sum(plain * weights)
    for mine, reference in zip(tape.gradient(fast, [bottom, embeddings]), tape.gradient(plain, [bottom, embeddings])):
        np.testing.assert_allclose(mine.numpy(), reference.numpy(), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------- float16 loss scaling


def test_float16_dynamic_loss_scale_skips_overflowing_steps():
    from tf_dlrm.parallel.env import DistributedEnv
    from tf_dlrm.optimizers.settings import LearningRateSchedule
    from tf_dlrm.embedding.training_step import LossScale
    from tf_dlrm.train.step import Trainer
    from tf_dlrm.optimizers.settings import OptimizerConfig

    model = small_model(policy="mixed_float16")
    trainer = Trainer(model, DistributedEnv(), OptimizerConfig(LearningRateSchedule(0.1), loss_scale=0.0))
    assert trainer.loss_scale.dynamic and float(trainer.loss_scale.scale.numpy()) == LossScale.INITIAL_DYNAMIC
    batches = batches_for(model, 3)
    for batch in batches[:2]:
        assert np.isfinite(trainer.train_step(*batch).numpy())
    assert int(trainer.loss_scale.good_steps.numpy()) == 2
    trainer.loss_scale.scale.assign(3e38)  # the scaled loss overflows float16: the step must be skipped
    before = [np.asarray(v).copy() for v in model.weights]
    trainer.train_step(*batches[2])
    assert all(np.array_equal(b, np.asarray(v)) for b, v in zip(before, model.weights)), "an overflowing step changed weights"
    assert float(trainer.loss_scale.scale.numpy()) == pytest.approx(1.5e38)
    assert int(trainer.loss_scale.good_steps.numpy()) == 0


def test_bfloat16_and_float32_take_no_loss_scale():
    from tf_dlrm.parallel.env import DistributedEnv
    from tf_dlrm.optimizers.settings import LearningRateSchedule
    from tf_dlrm.optimizers.settings import OptimizerConfig
    from tf_dlrm.train.step import Trainer

    for policy in ("float32", "mixed_bfloat16"):
        trainer = Trainer(small_model(policy=policy), DistributedEnv(), OptimizerConfig(LearningRateSchedule(0.1), loss_scale=0.0))
        assert trainer.loss_scale is None


# ---------------------------------------------------------------------- end to end through main.py


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    from conftest import make_synthetic_small

    return make_synthetic_small(tmp_path_factory.mktemp("synthetic_small_amp"), seed=3)


def train_main(directory, log, *flags, env=None):
    from conftest import run_python

    run_python(["main.py", f"--dataset_path={directory}", f"--log_path={log}", *MODEL_FLAGS, *flags], env=env)
    lines = [json.loads(line) for line in open(log, encoding="utf-8").read().splitlines()]
    config = next(line for line in lines if line["event"] == "config")
    return config, lines[-1]


@pytest.mark.slow
def test_amp_and_xla_training_reach_the_fp32_auc(synthetic, tmp_path):
    from arithmetic import EMULATED_AVX2_ENV, auc_standard_error, cpu_has_native_bfloat16, split_label_counts

    _, fp32 = train_main(synthetic, tmp_path / "fp32.jsonl")
    amp_config, amp = train_main(synthetic, tmp_path / "amp.jsonl", "--amp")
    # The bf16 arithmetic of CPUs without AVX-512 (Eigen's emulation), forced with --amp=true; on such
    # a CPU the --amp run above already is that arithmetic (tests/arithmetic.py).
    if cpu_has_native_bfloat16():
        emulated_config, emulated = train_main(synthetic, tmp_path / "emulated.jsonl", "--amp", env=EMULATED_AVX2_ENV)
    else:
        emulated_config, emulated = amp_config, amp
    xla_config, xla = train_main(synthetic, tmp_path / "xla.jsonl", "--xla")
    assert amp_config["precision"] == emulated_config["precision"] == "mixed_bfloat16" and xla_config["xla"] is True
    assert emulated_config["precision_native"] is False
    assert fp32["auc"] > 0.75, fp32
    # Different arithmetic trains along a different trajectory: the AUCs may differ by the training
    # noise, bounded by three standard errors of an AUC on this validation split (tests/arithmetic.py).
    positives, negatives = split_label_counts(synthetic)
    bound = 3 * auc_standard_error(fp32["auc"], positives, negatives)
    for name, run in (("amp", amp), ("amp, emulated bf16", emulated), ("xla", xla)):
        assert abs(run["auc"] - fp32["auc"]) <= bound, (name, run, fp32, bound)


# ---------------------------------------------------------------------- N ranks vs 1 under AMP / XLA

CASES = [
    {"name": "amp_table_wise", "policy": "mixed_bfloat16", "xla": False, "strategy": "table_wise", "data_parallel_input": False},
    {"name": "amp_column_wise_dp_input", "policy": "mixed_bfloat16", "xla": False, "strategy": "column_wise", "data_parallel_input": True},
    {"name": "amp_xla_auto", "policy": "mixed_bfloat16", "xla": True, "strategy": "auto", "data_parallel_input": False},
    {"name": "xla_column_wise", "policy": "float32", "xla": True, "strategy": "column_wise", "data_parallel_input": False},
    # Row bands (every model-parallel table of more than 1000 elements cut over the ranks), ids spread over every band.
    {"name": "xla_row_bands", "policy": "float32", "xla": True, "strategy": "table_wise", "data_parallel_input": False,
     "row_slice_threshold": 1000, "spread_ids": True},
]
# The equivalence worker's DLRM: bottom MLP [8, dim], top MLP [8, 4, 1].
DENSE_LAYERS = 5
BASE = {"seed": 3, "global_batch": 24, "steps": 3, "learning_rate": 0.1, "data_parallel_threshold": 100,
        "cardinalities": [50, 300, 500, 1000], "dim": 8}


@pytest.fixture(scope="module", params=sorted(ARITHMETIC_PATHS))
def rank_records(request, tmp_path_factory):
    """Every case at 2 ranks, once per arithmetic path: this CPU's own (oneDNN, native bf16 where the
    CPU has it) and the one of CPUs without AVX-512 (see tests/arithmetic.py), so that a tolerance
    which holds on one kind of CPU only fails here, not first on another machine."""
    from arithmetic import skip_if_emulated_path_is_native_here
    from conftest import launch

    skip_if_emulated_path_is_native_here(request.param)
    directory = tmp_path_factory.mktemp(f"amp_xla_np2_{request.param}")
    (directory / "cases.json").write_text(json.dumps([{**BASE, **case} for case in CASES]))
    launch(2, ["tests/train/test_amp_xla.py", str(directory / "cases.json"), str(directory)], timeout=600,
           env=ARITHMETIC_PATHS[request.param])
    return [record for rank in range(2) for record in json.loads((directory / f"rank{rank}.json").read_text())]


@pytest.mark.multirank
@pytest.mark.parametrize("case", [c["name"] for c in CASES])
def test_two_ranks_equal_one_process_under_amp_and_xla(case, rank_records):
    from arithmetic import BFLOAT16_UNIT_ROUNDOFF, bfloat16_forward_bound, bfloat16_update_bound

    records = [r for r in rank_records if r["case"] == case]
    assert len(records) == 2
    bf16 = next(c for c in CASES if c["name"] == case)["policy"] == "mixed_bfloat16"
    if bf16:
        # The ranks round in other places than the one-process reference (each rank's gradient sum
        # is rounded to bf16, then averaged; XLA fuses differently): bounds from bf16's unit
        # roundoff and the model's rounding points (tests/arithmetic.py), relative to the logits'
        # size and to the path each weight travelled, per tensor.
        forward_bound, update_bound = bfloat16_forward_bound(DENSE_LAYERS), bfloat16_update_bound(DENSE_LAYERS)
        # N ranks average the MLP gradients in bfloat16 (tf_dlrm.parallel.compressed_mean): two
        # more rounding points on their path (each rank's gradient, then the mean), 2 u more per step.
        update_bound += 2 * 2 * BFLOAT16_UNIT_ROUNDOFF
    else:
        # float32 + XLA only reorders float32 sums: the fp32 tolerances of the equivalence tests.
        forward_bound, update_bound = 1e-6, None
    for record in records:
        where = f"{case}, rank {record['rank']}"
        assert record["forward"]["scaled"] <= forward_bound, f"{where}: forward differs {record['forward']} > {forward_bound}"
        assert record["tables_moved"] > 1e-4, f"{where}: training did not change the tables"
        if case == "xla_row_bands":  # the three model-parallel tables really are cut into row bands
            assert record["banded_tables"] == 3, f"{where}: {record['banded_tables']} tables in row bands, expected 3"
        if update_bound is None:
            assert record["tables"]["rel"] <= 1e-5, f"{where}: tables differ {record['tables']}"
            assert record["mlp"]["rel"] <= 1e-5, f"{where}: MLP weights differ {record['mlp']}"
        else:
            assert record["tables_vs_path"] <= update_bound, f"{where}: tables differ by {record['tables_vs_path']} of their path > {update_bound}"
            assert record["mlp_vs_path"] <= update_bound, f"{where}: MLP weights differ by {record['mlp_vs_path']} of their path > {update_bound}"


def _reference_weights(reference, num_tables: int) -> list:
    """The one-process model's full tables, then its MLP weights, as numpy copies."""
    return [reference.embedding.get_full_table(t).copy() for t in range(num_tables)] + [v.numpy().copy() for v in mlp_variables(reference)]


def worker(cases_path: str, out_dir: str) -> None:
    """Under horovodrun: every case at N ranks vs the single-process reference, both in ``policy``."""
    sys.path.insert(0, os.path.join(REPO, "tests", "embedding"))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    import equivalence_worker as equivalence
    from arithmetic import relative_to_path
    from tf_dlrm.parallel import collectives
    from tf_dlrm.parallel import env as env_module
    from tf_dlrm.parallel.env import DistributedEnv
    from tf_dlrm.optimizers.settings import LearningRateSchedule
    from tf_dlrm.optimizers.settings import OptimizerConfig
    from tf_dlrm.train.step import Trainer

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    env = env_module.initialize(force_horovod=True)
    records = []
    for case in json.loads(open(cases_path).read()):
        restore = _policy(case["policy"])
        try:
            plan, model, reference = equivalence.make_models(case, env)
        finally:
            restore()
        config = OptimizerConfig(LearningRateSchedule(case["learning_rate"]))
        # The bfloat16 mean of the MLP gradients (--bf16_dense_allreduce) is what the bound below allows for.
        trainer = Trainer(model, env, config, jit_compile=case["xla"], compress_dense_gradients=True)
        trainer.broadcast_initial_state()
        reference_trainer = Trainer(reference, DistributedEnv(), config)
        batches = equivalence.make_batches(case, case["steps"] + 1)
        initial = [reference.embedding.get_full_table(t) for t in range(len(plan.tables))]
        record = {"case": case["name"], "rank": env.rank, "banded_tables": len(plan.row_sliced)}
        features, _ = equivalence.local_inputs(batches[0], model, env)
        logits = collectives.allgather(env, model(features))
        expected = reference(equivalence.reference_inputs(batches[0])[0])
        record["forward"] = equivalence.max_differences(logits.numpy(), expected.numpy())
        record["forward"]["scaled"] = record["forward"]["abs"] / max(1.0, float(np.abs(expected.numpy()).max()))
        reference_weights = _reference_weights(reference, len(plan.tables))
        paths = [0.0] * len(reference_weights)
        for batch in batches[1:]:
            trainer.train_step(*equivalence.local_inputs(batch, model, env))
            reference_trainer.train_step(*equivalence.reference_inputs(batch))
            moved = _reference_weights(reference, len(plan.tables))
            paths = [p + float(np.abs(after - before).max(initial=0.0)) for p, after, before in zip(paths, moved, reference_weights)]
            reference_weights = moved
        record["tables"] = equivalence.gathered_tables_diff(
            model, {f"table_{t}": reference.embedding.get_full_table(t) for t in range(len(plan.tables))}, "table")
        tables = [model.embedding.get_full_table(t) for t in range(len(plan.tables))]
        if env.is_chief:
            record["tables_vs_path"] = max(relative_to_path(mine, theirs, path) for mine, theirs, path
                                           in zip(tables, reference_weights, paths))
        else:
            record["tables_vs_path"] = 0.0  # the full tables are gathered on rank 0 only
        mlp = {"abs": 0.0, "rel": 0.0}
        for mine, theirs in zip(mlp_variables(model), mlp_variables(reference)):
            mlp = equivalence.worst(mlp, equivalence.max_differences(mine.numpy(), theirs.numpy()))
        record["mlp"] = mlp
        record["mlp_vs_path"] = max(relative_to_path(mine.numpy(), theirs, path) for mine, theirs, path
                                    in zip(mlp_variables(model), reference_weights[len(plan.tables):], paths[len(plan.tables):]))
        record["tables_moved"] = max(
            float(np.abs(reference.embedding.get_full_table(t) - initial[t]).max()) for t in range(len(plan.tables))
        )
        records.append(record)
    with open(os.path.join(out_dir, f"rank{env.rank}.json"), "w") as handle:
        json.dump(records, handle, indent=1)


if __name__ == "__main__":
    worker(sys.argv[1], sys.argv[2])
