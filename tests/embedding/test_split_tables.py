"""Split bf16 embedding tables (``--split_embedding_tables``, :mod:`tf_dlrm.embedding.split_tables`).

(a) N = 1, 2, 3, 4 ranks with split tables equal a float32 master-weight reference (float32 tables read
    truncated to bf16, updated in float32), for sgd, lazy_adam and adagrad, table-wise and column-wise
    (``split_tables_worker.py``). Tolerances:

    - against the reference at the **same** N (same plan, same batches): **0**. The two models do the
      same operations in the same order: the forward reads the same bf16 values (the high half is the
      truncation of the float32 weight, checked bit for bit), the backward delivers the same bf16
      gradient, which both take to float32 before summing repeated ids, and the update runs the same
      optimizer kernel on the joined float32 rows that the reference runs in place. Any broken bit
      (a lost low half, a rounded instead of truncated read, a bf16 sum of the gradient) shows here.
    - against the reference in **one** process: the two round in other places (each rank's MLP
      gradient sum is rounded to bf16 before the average; the rank's truncated reads see weights that
      differ in their last float32 bits, so one may fall on the other side of a bf16 boundary). The
      bound is tests/arithmetic.py's ``bfloat16_update_bound`` for the worker's 5 dense layers
      (``2 * m * u`` of the path each tensor travelled, ``m = 24`` rounding points, ``u = 2**-8``),
      plus ``2 * 2 * 2u`` for the truncated table read: each run's read is within ``2u`` of the
      float32 weight (truncation, not rounding, errs up to a whole bf16 spacing, ``2**-7`` relative),
      on the forward path of every gradient, so two runs' gradients differ by ``4u`` more.
(b) splitting and joining is bit exact (numpy, TensorFlow, and through the variables);
(c) a checkpoint saved from split tables restores into float32 tables and vice versa, bit for bit;
(d) the tables' bytes equal float32's (and the resident memory of a process holding one, printed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from arithmetic import ARITHMETIC_PATHS
from conftest import REPO, CaseLaunches, launch, worker_env
from tests.plan_layer import plan_layer

BASE = {"seed": 3, "global_batch": 24, "steps": 3, "learning_rate": 0.1, "data_parallel_threshold": 100,
        "cardinalities": [50, 300, 500, 1000], "dim": 8, "adam_epsilon": 1e-4}
# The MLPs train with SGD (their update linear in the gradient, as the bound assumes; test_amp_xla.py
# does the same): Adam on the MLPs moved a weight whose averaged gradient cancels to the rounding level
# by up to lr on the sign of that rounding (0.227 of its path once, at N=3), a property of Adam.
CASES = [{**BASE, "name": f"{optimizer}_{strategy}", "strategy": strategy, "embedding_optimizer": optimizer, "optimizer": "sgd"}
         for optimizer in ("sgd", "lazy_adam", "adagrad") for strategy in ("table_wise", "column_wise")]
# At 4 ranks (the costliest launch on 2 cores): table-wise leaving a rank empty, and column-wise cut in 4.
for _case in CASES:
    if _case["name"] not in ("sgd_table_wise", "adagrad_column_wise"):
        _case["world_sizes"] = (1, 2, 3)
DENSE_LAYERS = 5  # the worker's DLRM: bottom MLP [8, 8], top MLP [8, 4, 1]
WORKER = "tests/embedding/split_tables_worker.py"
# Every N on this CPU's kernels; N=2 also on the bf16 path of CPUs without AVX-512 (tests/arithmetic.py).
LAUNCHES = {"native": CaseLaunches(WORKER, CASES, world_sizes=(1, 2, 3, 4), env=ARITHMETIC_PATHS["native"]),
            "avx2": CaseLaunches(WORKER, CASES, world_sizes=(2,), env=ARITHMETIC_PATHS["avx2"])}


def _bits(count: int, seed: int) -> np.ndarray:
    """float32 values with random bit patterns plus the special ones (zeros, denormals, inf, NaN)."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, count, dtype=np.uint64).astype(np.uint32)
    special = np.array([0, 0x80000000, 1, 0x807FFFFF, 0x7F800000, 0xFF800000, 0x7FC00001, 0x3F80FFFF, 0xBF7FFFFF], np.uint32)
    return np.concatenate([special, bits]).view(np.float32)


def test_split_and_join_are_bit_exact():
    import tensorflow as tf

    from tf_dlrm.embedding.split_tables import join_arrays, join_tensors, split_array, split_tensor

    values = _bits(100_000, 1)
    high, low = split_array(values)
    assert np.array_equal(join_arrays(high, low).view(np.uint32), values.view(np.uint32))
    high_t, low_t = split_tensor(tf.constant(values))
    assert high_t.dtype == tf.bfloat16 and low_t.dtype == tf.uint16
    assert np.array_equal(tf.bitcast(high_t, tf.uint16).numpy(), high) and np.array_equal(low_t.numpy(), low)
    assert np.array_equal(tf.bitcast(join_tensors(high_t, low_t), tf.uint32).numpy(), values.view(np.uint32))
    # The high half read as bf16 is the value truncated toward zero: never farther than one bf16 spacing.
    finite = np.isfinite(values) & (np.abs(values) > 1e-30) & (np.abs(values) < 1e30)
    as_float = high_t.numpy().astype(np.float32)
    assert np.all(np.abs(as_float[finite]) <= np.abs(values[finite]))
    assert np.all(np.abs(values[finite] - as_float[finite]) < 2.0**-7 * np.abs(values[finite]))


def _layer(split: bool, rows=(300, 500), dim=6, seed=5):
    import keras

    from tf_dlrm.sharding.plan import TableSpec
    from tf_dlrm.sharding.planner import make_plan

    policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        plan = make_plan([TableSpec(f"t{i}", r, dim) for i, r in enumerate(rows)], 1, "table_wise", data_parallel_threshold=0)
        layer = plan_layer(plan, seed=seed, storage="split_bfloat16" if split else "float32")
        layer.build()
    finally:
        keras.mixed_precision.set_global_policy(policy)
    return layer


def test_split_variables_round_trip_and_hold_float32_bytes():
    import tensorflow as tf

    from tf_dlrm.embedding.split_tables import is_split, low_half_of, read_float32, table_bytes, write_float32
    from tf_dlrm.embedding.variable_kind import VariableKind, kind_of

    split, plain = _layer(True), _layer(False)
    (high,), (table,) = split.shard_variables, plain.shard_variables
    assert is_split(high) and not is_split(table)
    assert high.dtype == "bfloat16" and low_half_of(high).dtype == "uint16"
    assert kind_of(high) is VariableKind.SHARDED and kind_of(low_half_of(high)) is VariableKind.SPLIT_LOW
    # Same initial float32 tables, bit for bit, and the same bytes: 2 + 2 per weight.
    for t in range(2):
        assert np.array_equal(split.get_full_table(t).view(np.uint32), plain.get_full_table(t).view(np.uint32))
    assert table_bytes(split.shard_variables) == table_bytes(plain.shard_variables) == 800 * 6 * 4
    # Writing float32 rows and reading them back is exact, for any bits.
    values = _bits(800 * 6, 2)[: 800 * 6].reshape(800, 6)
    values = np.where(np.isfinite(values), values, np.float32(0.5))
    write_float32(high, 0, values)
    assert np.array_equal(read_float32(high).numpy().view(np.uint32), values.view(np.uint32))
    assert np.array_equal(tf.bitcast(tf.convert_to_tensor(high), tf.uint16).numpy(), (values.view(np.uint32) >> 16).astype(np.uint16))
    split.set_full_table(1, -values[300:])  # the second table sits at row 300
    assert np.array_equal(split.get_full_table(1).view(np.uint32), (-values[300:]).view(np.uint32))
    assert {f["table"]["placement"]["storage"] for f in split.get_config()["feature_configs"]} == {"split_bfloat16"}


def test_split_tables_are_filled_block_by_block_with_the_float32_values():
    """Three row blocks of the initialiser (16384 rows each) and two tables in one fused shard: the
    halves, filled block by block, join to the float32 shard's values bit for bit."""
    split, plain = _layer(True, rows=(40_000, 7)), _layer(False, rows=(40_000, 7))
    for t in range(2):
        assert np.array_equal(split.get_full_table(t).view(np.uint32), plain.get_full_table(t).view(np.uint32))
    assert np.abs(plain.get_full_table(0)).min() > 0  # every row written, none left at the zeros it started from


def test_unsupported_combinations_are_refused_naming_the_flag():
    import keras

    from tf_dlrm.sharding.plan import TableSpec
    from tf_dlrm.sharding.planner import make_plan

    plan = make_plan([TableSpec("t0", 300, 4), TableSpec("t1", 300, 4)], 2, "table_wise", data_parallel_threshold=0)
    with pytest.raises(ValueError, match=r"--split_embedding_tables needs bfloat16 compute .*--amp"):
        plan_layer(plan, storage="split_bfloat16")  # float32 policy
    policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        with pytest.raises(ValueError, match="--split_embedding_tables cannot be combined with --deduplicate_exchange"):
            plan_layer(plan, storage="split_bfloat16", deduplicate_exchange=True)
        with pytest.raises(ValueError, match="--split_embedding_tables cannot be combined with --hot_rows_budget"):
            plan_layer(plan, storage="split_bfloat16", hot_rows={0: [1, 2]})
    finally:
        keras.mixed_precision.set_global_policy(policy)


def test_flag_reaches_the_config():
    sys.path.insert(0, os.path.join(REPO, "tests", "checkpoint"))
    from checkpoint_worker import parse

    assert parse(["--dataset_path=x", "--amp", "--split_embedding_tables"]).sharding.split_embedding_tables is True
    assert parse(["--dataset_path=x"]).sharding.split_embedding_tables is False


@pytest.mark.multirank
@pytest.mark.parametrize("path,world_size,case", [pytest.param(path, *p.values, id=f"{path}-{p.id}")
                                                  for path, launches in LAUNCHES.items() for p in launches.params()])
def test_split_tables_equal_a_float32_master_weight_reference(world_size, path, case, tmp_path_factory):
    from arithmetic import BFLOAT16_UNIT_ROUNDOFF, bfloat16_update_bound, skip_if_emulated_path_is_native_here

    skip_if_emulated_path_is_native_here(path)
    bound = bfloat16_update_bound(DENSE_LAYERS) + 2 * 2 * 2 * BFLOAT16_UNIT_ROUNDOFF
    records = LAUNCHES[path].records(world_size, tmp_path_factory, case)
    assert len(records) == world_size
    for record in records:
        where = f"{case} at N={world_size} ({path} arithmetic), rank {record['rank']}"
        print(f"{where}: {json.dumps({k: v for k, v in record.items() if k != 'paths'})}")
        assert record["high_is_truncation"], f"{where}: a bf16 half is not the truncation of its float32 weight"
        assert record["forward_vs_reference_n"] == 0.0, f"{where}: forward differs from the same-N reference"
        assert record["mlp_vs_reference_n"] == 0.0, f"{where}: MLP weights differ from the same-N reference"
        assert record["mlp_vs_path"] <= bound, f"{where}: MLP weights differ by {record['mlp_vs_path']} of their path > {bound}"
        if record["rank"] == 0:  # full tables are gathered on rank 0
            assert record["initial_tables_equal"], f"{where}: joined initial tables differ from float32's"
            assert record["tables_moved"] > 1e-3, f"{where}: training did not change the tables"
            assert record["tables_vs_reference_n"] == 0.0, f"{where}: tables differ from the same-N reference {record}"
            assert record["tables_vs_path"] <= bound, f"{where}: tables differ by {record['tables_vs_path']} of their path > {bound}"
    assert sum(r["split_variables"] for r in records) >= 1


@pytest.mark.multirank
@pytest.mark.parametrize("world_size", (1, 2))
def test_checkpoints_move_between_split_and_float32_tables(world_size, tmp_path_factory):
    from tf_dlrm.data.synthetic import generate
    from tf_dlrm.spec.feature_spec import FeatureSpec

    data = str(tmp_path_factory.mktemp("split_checkpoint_data"))
    spec = FeatureSpec.load(os.path.join(REPO, "feature_specs", "synthetic_small.yaml"), check_files=False)
    generate(spec, data, num_train_samples=1536, num_valid_samples=768, seed=1)
    out = str(tmp_path_factory.mktemp(f"split_checkpoint_np{world_size}"))
    worker = "tests/checkpoint/split_checkpoint_worker.py"
    if world_size == 1:
        subprocess.run([sys.executable, worker, data, out], cwd=REPO, env=worker_env(), check=True, capture_output=True, timeout=600)
    else:
        launch(world_size, [worker, data, out])
    with open(os.path.join(out, "results.json")) as handle:
        results = json.load(handle)
    for saved in ("split", "float32"):
        for form, dtype in (("into_split", "bfloat16"), ("into_float32", "float32")):
            record = results[f"{saved}_{form}"]
            assert record["shard_dtypes"] == [dtype], f"{saved} checkpoint {form}: {record}"
            assert record["tables"] == 8 and record["equal_bits"], f"{saved} checkpoint {form}: restored tables differ: {record}"


def test_resident_memory_of_a_large_table_equals_float32():
    """2M x 64 (512,000,000 bytes in float32): the variables' bytes are equal; the process's resident
    growth once glibc has returned its free arena memory (``malloc_trim``) is within 10% of each
    other (both forms hold the table once: a second copy of either half would be 50% more), and the
    peak while building is within 25%.

    Untrimmed growth is not compared: glibc keeps 0 to 70 MB of the build's freed per-block
    temporaries from run to run (CI once printed split 580,124,672 vs float32 515,948,544 bytes; a
    run here printed 570,683,392 vs 530,358,272 untrimmed, 513,286,144 vs 512,200,704 trimmed).
    Trimmed, what stays besides the table also varies by tens of MB (the benchmark builds a small
    layer of the same form first, so that one-time loads are in its baseline): split 549,187,584 vs
    float32 529,870,848 bytes in one run, 560,529,408 vs 548,601,856 without that warm-up in another."""
    completed = subprocess.run([sys.executable, "benchmarks/split_table_memory.py", "--rows=2000000", "--dim=64"], cwd=REPO,
                               env=worker_env(), check=True, capture_output=True, text=True, timeout=600)
    records = {r["form"]: r for r in map(json.loads, completed.stdout.strip().splitlines())}
    print(json.dumps(records, indent=1))
    assert records["split"]["table_bytes"] == records["float32"]["table_bytes"] == 2_000_000 * 64 * 4
    assert set(records["split"]["variables"].values()) == {"bfloat16", "uint16"}
    held_split, held_float32 = records["split"]["rss_growth_trimmed"], records["float32"]["rss_growth_trimmed"]
    assert abs(held_split - held_float32) <= 0.10 * held_float32, (held_split, held_float32)
    assert held_split >= 0.98 * 512_000_000  # the table is really resident, not lazily allocated
    # Building it needs no more than float32's plus the allocator's slack: both halves are filled
    # block by block (cut from one float32 copy of the shard, the peak was 3.5 times the table;
    # a copy of half the table would already make 1.5 times).
    peak_split, peak_float32 = records["split"]["peak_growth"], records["float32"]["peak_growth"]
    assert peak_split <= 1.25 * peak_float32, (peak_split, peak_float32)


def test_throughput_benchmark_has_a_split_tables_case():
    completed = subprocess.run(
        [sys.executable, "benchmarks/train_throughput.py", "--config=tiny", "--cases=tf_dlrm_amp,tf_dlrm_amp_split",
         "--windows=1", "--window_steps=2", "--warmup_steps=1", "--num_batches=2"],
        cwd=REPO, env=worker_env(), check=True, capture_output=True, text=True, timeout=600)
    records = {r["case"]: r for r in map(json.loads, (line for line in completed.stdout.splitlines() if line.startswith("{")))}
    assert records["tf_dlrm_amp_split"]["split_embedding_tables"] is True
    assert records["tf_dlrm_amp"]["split_embedding_tables"] is False
    assert records["tf_dlrm_amp_split"]["precision"] == "bf16" and records["tf_dlrm_amp_split"]["samples_per_s"]["median"] > 0
