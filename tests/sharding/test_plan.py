"""Tests of the pure-Python sharding plan: exact assignments on small hand-computed cases,
ownership and permutation properties on many generated plans, and the Criteo balance goal."""

import itertools
import json
import os
import pathlib
import random
import subprocess
import sys

import pytest

from tf_dlrm.sharding.plan import TableSlice, ShardingPlan, Strategy, TableSpec
from tf_dlrm.sharding.packing import band_permutations, output_permutation, received_labels
from tf_dlrm.sharding.planner import make_plan, split_columns

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
STRATEGIES = [s.value for s in Strategy]
CRITEO_CARDINALITIES = [40000000] * 4 + [
    40790948, 3067956, 590152, 405282, 39060, 20265, 17295, 12973, 11938, 7424, 7122, 2209,
    1543, 976, 155, 108, 63, 36, 14, 10, 4, 3]


def tables_of(*shapes):
    return [TableSpec(f"t{index}", rows, dim) for index, (rows, dim) in enumerate(shapes)]


TABLE_SETS = {
    "odd_dim": tables_of((5000, 7), (3000, 7), (100, 4)),
    "one_table": tables_of((10000, 16),),
    "two_tables": tables_of((10000, 16), (5000, 16)),
    "skewed": tables_of((1000000, 8), (20000, 8), (9000, 8), (4000, 8), (2500, 8), (50, 8)),
    "narrow": tables_of((4000, 1), (4000, 2), (9000, 3)),
    "mixed_dims": tables_of((70000, 32), (3000, 64), (8000, 5), (2048, 3), (2047, 16)),
    "all_replicated": tables_of((10, 4), (2000, 4)),
}


def column_owners(plan):
    """(table, column) -> list of ranks, computed from rank_slices without plan methods; a column
    of a row-sliced table counts once when its row bands (owned by distinct ranks) tile its rows."""
    owners, bands = {}, {}
    for rank, slices in enumerate(plan.rank_slices):
        for piece in slices:
            for column in range(piece.column_start, piece.column_end):
                end = plan.tables[piece.table].rows if piece.row_end is None else piece.row_end
                bands.setdefault((piece.table, column), []).append((piece.row_start, end, rank))
    for (table, column), spans in bands.items():
        spans.sort()
        tiled = [end for _, end, _ in spans[:-1]] == [start for start, _, _ in spans[1:]]
        whole = spans[0][0] == 0 and spans[-1][1] == plan.tables[table].rows and tiled
        ranks = [rank for _, _, rank in spans]
        owners[table, column] = ranks[:1] if whole and len(set(ranks)) == len(ranks) else ranks
    return owners


def all_plans():
    for (set_name, tables), world_size, strategy in itertools.product(
            TABLE_SETS.items(), range(1, 9), STRATEGIES):
        yield f"{set_name}-{world_size}-{strategy}", make_plan(tables, world_size, strategy)


def test_plan_module_imports_no_framework():
    code = ("import sys, tf_dlrm.sharding.planner; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'tensorflow', 'horovod', 'numpy', 'keras'}))")
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def test_every_model_parallel_column_is_owned_exactly_once():
    for label, plan in all_plans():
        owners = column_owners(plan)
        expected = {(t, c) for t in plan.model_parallel for c in range(plan.tables[t].dim)}
        assert set(owners) == expected, label
        assert all(len(ranks) == 1 for ranks in owners.values()), label
        for rank, slices in enumerate(plan.rank_slices):
            assert list(slices) == sorted(slices, key=lambda p: (p.table, p.column_start)), label
            assert len({p.table for p in slices}) == len(slices), label


@pytest.mark.parametrize("threshold", [0, 2048, 5000, 10**9])
def test_replicated_tables_are_exactly_those_under_the_threshold(threshold):
    tables = TABLE_SETS["mixed_dims"]
    for world_size, strategy in itertools.product([1, 3, 4], STRATEGIES):
        plan = make_plan(tables, world_size, strategy, data_parallel_threshold=threshold)
        assert plan.replicated == tuple(t for t, s in enumerate(tables) if s.rows < threshold)
        assert plan.model_parallel == tuple(t for t, s in enumerate(tables) if s.rows >= threshold)


@pytest.mark.parametrize("world_size", [2, 4, 8, 16, 32, 64])
def test_auto_plan_balances_criteo(world_size):
    tables = [TableSpec(f"cat_{i}", rows, 128) for i, rows in enumerate(CRITEO_CARDINALITIES)]
    plan = make_plan(tables, world_size)
    assert plan.strategy == "auto"
    assert plan.imbalance() <= 1.10
    assert all(plan.rank_slices), "every rank must own at least one slice"
    assert plan.replicated == tuple(range(16, 26))
    assert make_plan(tables, world_size) == plan  # deterministic


CRITEO_CAPPED_CARDINALITIES = [100000] * 8 + [39060, 20265, 17295, 12973, 11938, 7424, 7122, 2209, 1543, 976, 155, 108, 63, 36, 14, 10, 4, 3]  # feature_specs/criteo_capped.yaml


def test_auto_plan_balances_lookup_widths_within_the_memory_bound():
    """Greedy by bytes alone gives 9 and 7 tables of 128 columns at N=2 (widths 1152 / 896)."""
    tables = [TableSpec(f"cat_{i}", rows, 128) for i, rows in enumerate(CRITEO_CAPPED_CARDINALITIES)]
    by_bytes = make_plan(tables, 2, "table_wise")
    assert sorted(by_bytes.rank_width(r) for r in range(2)) == [896, 1152]
    plan = make_plan(tables, 2)
    assert [plan.rank_width(r) for r in range(2)] == [1024, 1024]
    assert plan.imbalance() <= 1.05
    for world_size in (3, 4, 8):
        balanced = make_plan(tables, world_size)
        assert balanced.imbalance() <= 1.10 and all(balanced.rank_slices)


def test_split_columns_widths_differ_by_at_most_one():
    assert split_columns(7, 3) == ((0, 3), (3, 5), (5, 7))
    assert split_columns(128, 3) == ((0, 43), (43, 86), (86, 128))
    for dim in range(1, 40):
        for num_slices in range(1, dim + 1):
            bounds = split_columns(dim, num_slices)
            widths = [end - start for start, end in bounds]
            assert len(bounds) == num_slices and min(widths) >= 1
            assert max(widths) - min(widths) <= 1
            assert widths == sorted(widths, reverse=True)  # extra columns go first
            assert [b[0] for b in bounds] == [0] + [b[1] for b in bounds[:-1]]
            assert bounds[-1][1] == dim


def test_split_columns_rejects_bad_counts():
    with pytest.raises(ValueError, match=r"Cannot split a table of dim 5 into 7 column slices"):
        split_columns(5, 7)
    with pytest.raises(ValueError, match=r"Cannot split table 'cat_3' of dim 5 into 0 column"):
        split_columns(5, 0, table_name="cat_3")


def whole(table, dim=8):
    return TableSlice(table, 0, dim)


def test_table_wise_greedy_assignment():
    # Elements 8000, 4800, 4000, 2400, 2400 (the last two tie: lower id first).
    tables = tables_of((1000, 8), (600, 8), (500, 8), (300, 8), (300, 8))
    plan = make_plan(tables, 2, "table_wise", data_parallel_threshold=0)
    # A->r0 (8000); B->r1 (4800); C->r1 (8800); D->r0 (10400); E->r1 (11200).
    assert plan.rank_slices == ((whole(0), whole(3)), (whole(1), whole(2), whole(4)))
    assert [plan.rank_bytes(r) for r in range(2)] == [41600, 44800]
    assert make_plan(tables, 3, "table_wise", data_parallel_threshold=0).rank_slices == (
        (whole(0),), (whole(1), whole(4)), (whole(2), whole(3)))


def test_table_wise_allows_idle_ranks_and_respects_column_slice_threshold():
    tables = tables_of((10000, 16), (5000, 16))
    plan = make_plan(tables, 4, "table_wise")
    assert [len(s) for s in plan.rank_slices] == [1, 1, 0, 0]
    # 160000 elements / 50000 -> 4 slices; 80000 / 50000 -> 2 slices.
    plan = make_plan(tables, 4, "table_wise", column_slice_threshold=50000)
    assert [p.width for _, p in plan.table_slices(0)] == [4, 4, 4, 4]
    assert [p.width for _, p in plan.table_slices(1)] == [8, 8]
    assert make_plan(tables, 1, "table_wise", column_slice_threshold=50000).rank_slices == (
        (TableSlice(0, 0, 16), TableSlice(1, 0, 16)),)


def test_column_wise_splits_dim_7_over_3_distinct_ranks():
    plan = make_plan(tables_of((5000, 7)), 3, "column_wise")
    pairs = plan.table_slices(0)
    assert [p.width for _, p in pairs] == [3, 2, 2]
    assert [(p.column_start, p.column_end) for _, p in pairs] == [(0, 3), (3, 5), (5, 7)]
    assert sorted(rank for rank, _ in pairs) == [0, 1, 2]
    # More ranks than columns: only dim slices, the other ranks idle.
    plan = make_plan(tables_of((5000, 2)), 4, "column_wise")
    assert sum(len(s) for s in plan.rank_slices) == 2


def test_world_size_one_holds_whole_tables():
    for strategy in STRATEGIES:
        plan = make_plan(TABLE_SETS["mixed_dims"], 1, strategy)
        assert plan.rank_slices == ((TableSlice(0, 0, 32), TableSlice(1, 0, 64),
                                     TableSlice(2, 0, 5), TableSlice(3, 0, 3)),)
        assert plan.imbalance() == 1.0


def test_auto_fills_every_rank_when_there_are_fewer_tables_than_ranks():
    # 160000 and 80000 elements on 3 ranks: halving the first table balances exactly.
    plan = make_plan(tables_of((10000, 16), (5000, 16)), 3)
    assert all(plan.rank_slices)
    assert plan.imbalance() == 1.0
    plan = make_plan(tables_of((10000, 4), (5000, 2)), 8)  # only 6 columns for 8 ranks
    assert sum(1 for s in plan.rank_slices if s) == 6


def test_all_replicated_plan_has_no_slices():
    for strategy in STRATEGIES:
        plan = make_plan(TABLE_SETS["all_replicated"], 3, strategy)
        assert plan.replicated == (0, 1) and plan.rank_slices == ((), (), ())
        assert plan.imbalance() == 1.0
        assert plan.alltoall_bytes_per_step(6) == 0


def hand_plan():
    # t0 (dim 3) split over both ranks, t1 replicated, t2 (dim 2) whole on rank 1.
    return ShardingPlan(
        world_size=2, tables=tables_of((5000, 3), (100, 2), (4000, 2)), strategy="auto",
        replicated=(1,),
        rank_slices=((TableSlice(0, 1, 3),), (TableSlice(0, 0, 1), TableSlice(2, 0, 2))))


def test_hand_plan_accessors():
    plan = hand_plan()
    # Received columns (one feature per table; rank 1 packs its width-2 slice first):
    # [t0c1, t0c2 | t2c0, t2c1, t0c0] -> t0c0 t0c1 t0c2 t2c0 t2c1.
    labels = received_labels(plan, [0, 2])
    assert output_permutation(plan, [0, 2], labels) == [4, 0, 1, 2, 3]
    assert [labels[i] for i in [4, 0, 1, 2, 3]] == [(0, 0, 0), (0, 1, 0), (0, 2, 0), (1, 0, 0), (1, 1, 0)]
    assert plan.model_parallel == (0, 2)
    assert plan.table_slices(0) == ((1, TableSlice(0, 0, 1)), (0, TableSlice(0, 1, 3)))
    assert plan.table_slices(1) == ()
    assert plan.tables_on_rank(0) == (0,) and plan.tables_on_rank(1) == (0, 2)
    assert [plan.rank_width(r) for r in range(2)] == [2, 3]
    # rank 0: 5000*2 + 200 replicated; rank 1: 5000 + 8000 + 200; 4 bytes each.
    assert [plan.rank_bytes(r) for r in range(2)] == [40800, 52800]
    assert plan.total_bytes() == (15000 + 200 + 8000) * 4
    assert plan.imbalance() == pytest.approx(52800 / 46800)
    # Global batch 8 -> local 4; the widest rank (3 columns) sends 1 block of 4x3 floats.
    assert plan.alltoall_bytes_per_step(8) == 48
    assert plan.alltoall_bytes_per_step(8, bytes_per_value=2) == 24
    with pytest.raises(ValueError, match="multiple of world_size=2"):
        plan.alltoall_bytes_per_step(7)


def test_exchange_labels_reassemble_every_feature_for_many_plans():
    """The received block's labels, permuted by output_permutation and each further band's permutation,
    give every feature's columns once per row band of its table (the layer sums the bands)."""
    generator = random.Random(1234)
    plans = [plan for _, plan in all_plans()]
    for _ in range(40):
        shapes = [(generator.choice([100, 3000, 50000, 10**6]), generator.randint(1, 12))
                  for _ in range(generator.randint(1, 7))]
        world_size, strategy = generator.randint(1, 9), generator.choice(STRATEGIES)
        plans.append(make_plan(tables_of(*shapes), world_size, strategy,
                               column_slice_threshold=generator.choice([None, 20000]),
                               row_slice_threshold=generator.choice([None, 50000])))
    assert any(plan.row_sliced for plan in plans)
    for plan in plans:
        features = list(plan.model_parallel) + list(plan.model_parallel[:1])  # a table read twice
        if not features:
            continue
        labels = received_labels(plan, features)
        if len(labels) and labels[-1][0] == "padding":
            labels = [label for label in labels if label[0] != "padding"] + labels[-1:]
        permutations = [output_permutation(plan, features, labels)] + band_permutations(plan, features, labels)
        chosen = [labels[i] for perm in permutations for i in perm if i < len(labels)]
        expected = [(f, c, start) for f, t in enumerate(features) for start, _ in plan.row_bands(t)
                    for c in range(plan.tables[t].dim)]
        assert sorted(chosen) == sorted(expected)
        for perm in permutations:  # feature order within every band
            assert [labels[i][:2] for i in perm if i < len(labels)] == \
                [(f, c) for f, t in enumerate(features) for c in range(plan.tables[t].dim)
                 if len(plan.row_bands(t)) > permutations.index(perm)]


def test_dict_round_trip_through_json():
    plans = [hand_plan()] + [plan for label, plan in all_plans() if label.endswith("-3-auto")]
    for plan in plans:
        config = plan.to_dict()
        assert ShardingPlan.from_dict(config) == plan
        assert ShardingPlan.from_dict(json.loads(json.dumps(config))) == plan
    assert hand_plan().to_dict()["rank_slices"] == [[[0, 1, 3]], [[0, 0, 1], [2, 0, 2]]]


@pytest.mark.parametrize("change, message", [
    (lambda d: d.pop("tables"), r"Missing: \['tables'\]"),
    (lambda d: d.update(shards=[]), r"unknown: \['shards'\]"),
    (lambda d: d.update(world_size="2"), r"Expected world_size to be an integer"),
    (lambda d: d.update(strategy="row_wise"), r"Expected strategy to be one of"),
    (lambda d: d["tables"][0].pop("dim"), r"expected each table as \{name, rows, dim\}"),
    (lambda d: d["rank_slices"][1].append([2, 0]), r"expected a slice \[table, start, end\]"),
    (lambda d: d.update(rank_slices="[]"), r"expected rank_slices to be a list"),
    (lambda d: d["rank_slices"][1][0].__setitem__(2, 2), r"Columns \[1:2\) of table 't0'"),
])
def test_from_dict_rejects_malformed_input(change, message):
    config = hand_plan().to_dict()
    change(config)
    with pytest.raises(ValueError, match=r"Malformed sharding plan dict.*" + message):
        ShardingPlan.from_dict(config)
    with pytest.raises(ValueError, match="Expected a sharding plan dict"):
        ShardingPlan.from_dict([config])


@pytest.mark.parametrize("rank_slices, message", [
    (((TableSlice(0, 1, 3),), (TableSlice(2, 0, 2),)),
     r"Columns \[0:1\) of table 't0' \(id 0, dim 3\) are owned by no rank"),
    (((TableSlice(0, 0, 3),), (TableSlice(0, 2, 3), TableSlice(2, 0, 2))),
     r"Columns \[2:3\) of table 't0' .* more than one rank \(ranks 0 and 1\)"),
    (((TableSlice(0, 0, 4),), (TableSlice(2, 0, 2),)), r"Columns \[3:4\) of table 't0'"),
    (((TableSlice(0, 0, 3), TableSlice(1, 0, 2)), (TableSlice(2, 0, 2),)),
     r"model-parallel tables only.*table 1 't1' is replicated"),
    (((TableSlice(0, 0, 3),), (TableSlice(2, 0, 2),), ()), r"one slice list per rank \(2\)"),
    (((TableSlice(0, 0, 2), TableSlice(0, 2, 3)), (TableSlice(2, 0, 2),)),
     r"sorted by table, at most one per table"),
])
def test_plan_validation_names_table_and_columns(rank_slices, message):
    with pytest.raises(ValueError, match=message):
        ShardingPlan(world_size=2, tables=hand_plan().tables, strategy="auto", replicated=(1,),
                     rank_slices=rank_slices)


@pytest.mark.parametrize("kwargs, message", [
    (dict(world_size=0), r"Expected world_size >= 1. Received: world_size=0"),
    (dict(world_size=2.0), r"Expected world_size to be an integer. Received: world_size=2.0"),
    (dict(strategy="row_wise"),
     r"Expected strategy to be one of 'table_wise', 'column_wise', 'auto'. "
     r"Received: strategy='row_wise'"),
    (dict(data_parallel_threshold=-1), r"Expected data_parallel_threshold >= 0"),
    (dict(column_slice_threshold=0), r"Expected column_slice_threshold >= 1"),
    (dict(tables=[]), r"Expected at least one embedding table"),
    (dict(tables=tables_of((10, 4)) * 2), r"Expected unique table names. Received: 't0'"),
])
def test_make_plan_errors(kwargs, message):
    arguments = {"tables": tables_of((5000, 4)), "world_size": 2, **kwargs}
    with pytest.raises(ValueError, match=message):
        make_plan(**arguments)


def test_table_spec_and_slice_validation():
    with pytest.raises(ValueError, match=r"Expected rows >= 1 for table 'cat_0'. Received: rows=0"):
        TableSpec("cat_0", 0, 4)
    with pytest.raises(ValueError, match=r"Expected dim to be an integer for table 'x'"):
        TableSpec("x", 10, True)
    with pytest.raises(ValueError, match=r"Expected column_end >= 3"):
        TableSlice(0, 2, 2)
    assert TableSpec("x", 10, 4).elements == 40 and TableSlice(1, 2, 7).width == 5
    assert make_plan(tables_of((5000, 4)), 2, Strategy.COLUMN_WISE).strategy == "column_wise"


def test_describe_lists_every_rank():
    text = hand_plan().describe()
    lines = text.splitlines()
    assert "world_size=2" in lines[0] and "strategy=auto" in lines[0]
    assert "rank 0:" in lines[1] and "t0[1:3]" in lines[1]
    assert "t0[0:1] t2[0:2]" in lines[2] and "51.56 KiB" in lines[2]
    assert "replicated" in lines[3] and "t1" in lines[3]
    assert lines[4].endswith("1.128")


# ---------------------------------------------------------------- tables read by several features


def test_a_table_read_by_two_features_counts_two_exchange_vectors():
    """t0 (4000 x 16) is read by two features, t1 (1000 x 4) and t2 (4000 x 16) by one each.

    Memory alone puts t0 and t1 on rank 0 and t2 on rank 1 (68k / 64k elements, imbalance
    1.03); rank 0 then sends 2 * 16 + 4 = 36 columns per sample, rank 1 16. Counting t0's two
    pooled vectors, the planner moves t1 to rank 1 (same imbalance, 1.03): 32 and 20 columns.
    """
    from tf_dlrm.sharding.packing import alltoall_bytes_per_step, send_width
    from tf_dlrm.sharding.planner import table_readers

    tables = tables_of((4000, 16), (1000, 4), (4000, 16))
    feature_tables = [0, 0, 1, 2]  # two features read t0
    readers = table_readers(feature_tables, 3)
    assert readers == (2, 1, 1)
    blind = make_plan(tables, 2, data_parallel_threshold=0)
    counted = make_plan(tables, 2, data_parallel_threshold=0, readers=readers)
    assert blind.rank_slices == ((TableSlice(0, 0, 16), TableSlice(1, 0, 4)), (TableSlice(2, 0, 16),))
    assert counted.rank_slices == ((TableSlice(0, 0, 16),), (TableSlice(1, 0, 4), TableSlice(2, 0, 16)))
    assert counted.imbalance() == pytest.approx(blind.imbalance()) == pytest.approx(68 / 66)
    # What the layer really sends (tf_dlrm.sharding.packing, which DistributedEmbedding uses).
    assert [send_width(blind, r, feature_tables) for r in range(2)] == [36, 16]
    assert [send_width(counted, r, feature_tables) for r in range(2)] == [32, 20]
    assert alltoall_bytes_per_step(counted, feature_tables, 8) == 1 * 4 * 32 * 4
    # One reader per table is the default: the same plan as no readers at all.
    assert make_plan(tables, 2, data_parallel_threshold=0, readers=(1, 1, 1)) == blind


def test_plan_tables_counts_the_features_of_each_table():
    from tf_dlrm.embedding.table_config import FeatureConfig, TableConfig
    from tf_dlrm.embedding.planning import plan_tables

    user, device, item = TableConfig("user", 4000, 16), TableConfig("device", 1000, 4), TableConfig("item", 4000, 16)
    features = [FeatureConfig("user_now", user), FeatureConfig("user_before", user, hotness=5),
                FeatureConfig("device", device), FeatureConfig("item", item)]
    plan = plan_tables([user, device, item], features, 2, data_parallel_threshold=0)  # nothing replicated
    assert plan.tables_on_rank(0) == (0,) and plan.tables_on_rank(1) == (1, 2)
    one_each = [FeatureConfig(t.name, t) for t in (user, device, item)]
    assert plan_tables([user, device, item], one_each, 2, data_parallel_threshold=0).tables_on_rank(0) == (0, 1)
    # By default, on several ranks, tables of fewer than 2048 rows are replicated, as main.py's.
    assert plan_tables([user, device, item], one_each, 2).replicated == (1,)
    assert plan_tables([user, device, item], one_each, 1).replicated == ()


def test_placements_are_honoured_whatever_the_strategy():
    tables = tables_of((4000, 16), (1000, 4), (4000, 16), (50, 8))
    requested = ("column_wise", "replicated", "table_wise", "auto")
    for strategy in ("table_wise", "column_wise", "auto"):
        plan = make_plan(tables, 2, strategy=strategy, data_parallel_threshold=100, placements=requested)
        assert plan.replicated == (1, 3), strategy  # table 1 asked for it, table 3 is under the threshold
        assert len(plan.table_slices(0)) == 2 and len(plan.table_slices(2)) == 1, strategy
    plan = make_plan(tables, 3, strategy="column_wise", data_parallel_threshold=0,
                     placements=("table_wise", "auto", "auto", "auto"))
    assert len(plan.table_slices(0)) == 1 and len(plan.table_slices(2)) == 3
    # One process still replicates a table that asks for it (and nothing else).
    assert make_plan(tables, 1, data_parallel_threshold=0, placements=("auto", "replicated", "auto", "auto")).replicated == (1,)
    with pytest.raises(ValueError, match="Expected the placement of table 't0' in"):
        make_plan(tables, 2, placements=("diagonal", "auto", "auto", "auto"))
    with pytest.raises(ValueError, match=r"one placement per table \(4\)"):
        make_plan(tables, 2, placements=("auto",))


@pytest.mark.parametrize("readers, message", [
    ((1, 1), r"one reader count per table \(3\)"),
    ((1, -1, 1), r"Expected readers >= 0 of table 't1'"),
    ((1, 1.5, 1), r"Expected readers to be an integer of table 't1'"),
])
def test_bad_reader_counts_are_refused(readers, message):
    with pytest.raises(ValueError, match=message):
        make_plan(tables_of((4000, 16), (1000, 4), (4000, 16)), 2, data_parallel_threshold=0, readers=readers)


# ---------------------------------------------------------------- row bands


def test_row_slice_threshold_cuts_tables_into_bands_over_every_rank():
    """NVIDIA's rule: a table of more elements than --row_slice_threshold is cut into N row bands (whole columns),
    before any column slicing; smaller tables are planned as before."""
    tables = tables_of((10_000, 8), (1000, 8), (2000, 8))
    for strategy in STRATEGIES:
        plan = make_plan(tables, 3, strategy, data_parallel_threshold=0, row_slice_threshold=20_000)
        assert plan.row_sliced == (0,), strategy
        assert plan.row_bands(0) == ((0, 3334), (3334, 6667), (6667, 10_000))
        assert sorted(rank for rank, _ in plan.table_slices(0)) == [0, 1, 2]
        assert all(p.width == 8 for _, p in plan.table_slices(0))
        assert len(plan.row_bands(1)) == len(plan.row_bands(2)) == 1
    # The bands' bytes are each rank's third; memory lines count rows of the band only.
    plan = make_plan(tables_of((9000, 4)), 3, data_parallel_threshold=0, row_slice_threshold=1)
    assert [plan.rank_bytes(r) for r in range(3)] == [3000 * 4 * 4] * 3
    with pytest.raises(ValueError, match=r"Expected row_slice_threshold >= 1"):
        make_plan(tables, 2, row_slice_threshold=0)


def test_row_wise_and_grid_placements():
    tables = tables_of((8000, 6), (500, 4))
    plan = make_plan(tables, 4, data_parallel_threshold=0, placements=("row_wise", "auto"))
    assert plan.row_bands(0) == ((0, 2000), (2000, 4000), (4000, 6000), (6000, 8000))
    plan = make_plan(tables, 4, data_parallel_threshold=0, placements=("grid", "auto"))
    assert plan.row_bands(0) == ((0, 4000), (4000, 8000)) and plan.column_split(0)
    assert sorted((p.row_start, p.column_start, p.column_end) for _, p in plan.table_slices(0)) == \
        [(0, 0, 3), (0, 3, 6), (4000, 0, 3), (4000, 3, 6)]
    # A prime number of ranks has no grid: column slices only. One process: the table whole.
    assert make_plan(tables, 3, data_parallel_threshold=0, placements=("grid", "auto")).row_bands(0) == ((0, 8000),)
    assert make_plan(tables, 1, data_parallel_threshold=0, placements=("row_wise", "auto")).rank_slices == ((TableSlice(0, 0, 6), TableSlice(1, 0, 4)),)
    # A table kept whole (row-wise optimizer state) may be cut into bands, not into a grid.
    kept = ("row-wise state", None)
    assert make_plan(tables, 2, data_parallel_threshold=0, placements=("row_wise", "auto"), kept_whole=kept).row_sliced == (0,)
    with pytest.raises(ValueError, match="Table 't0' cannot be placed grid: row-wise state"):
        make_plan(tables, 4, placements=("grid", "auto"), kept_whole=kept)


def test_auto_cuts_a_tall_narrow_table_into_bands_where_columns_cannot_spread_it():
    """A 40M-row table of width 4 on 8 ranks: column slices give at most 4 pieces (half the ranks hold a quarter of it
    each); row bands give every rank an eighth. The tables that column slices spread well stay whole or column-sliced."""
    tables = tables_of((40_000_000, 4), (100_000, 4), (50_000, 4))
    before = make_plan(tables, 8, placements=("column_wise", "auto", "auto"))
    after = make_plan(tables, 8)
    assert after.row_sliced == (0,) and len(after.row_bands(0)) == 8
    assert max(after.rank_bytes(r) for r in range(8)) < 0.55 * max(before.rank_bytes(r) for r in range(8))
    # Wide tables on few ranks: column slices are enough, no bands (each band would send the whole width).
    assert make_plan(tables_of((40_000_000, 128), (100_000, 128)), 8).row_sliced == ()
    # A table kept whole (a row-wise optimizer with several readers) is cut into bands instead of left on one rank.
    kept = make_plan(tables_of((1_000_000, 16), (1000, 16), (2000, 16)), 4, data_parallel_threshold=0,
                     kept_whole=("row-wise state", None, None))
    assert kept.row_sliced == (0,) and not kept.column_split(0)


def test_row_bands_round_trip_and_are_described():
    plan = make_plan(tables_of((9000, 4), (100, 2)), 3, data_parallel_threshold=0, row_slice_threshold=1000)
    config = plan.to_dict()
    assert sorted(s for slices in config["rank_slices"] for s in slices if s[0] == 0) == \
        [[0, 0, 4, 0, 3000], [0, 0, 4, 3000, 6000], [0, 0, 4, 6000, 9000]]
    assert ShardingPlan.from_dict(json.loads(json.dumps(config))) == plan
    # A band ending at the table's last row equals the same band written with row_end=None.
    assert TableSlice(0, 0, 4, 6000, 9000).canonical(9000) == TableSlice(0, 0, 4, 6000)
    assert "t0[0:4] rows [3000:6000)" in plan.describe()


@pytest.mark.parametrize("rank_slices, message", [
    (((TableSlice(0, 0, 3, 0, 2000),), (TableSlice(0, 0, 3, 3000), TableSlice(2, 0, 2))),
     r"Rows \[2000:3000\) of table 't0' \(id 0, 5000 rows\) are owned by no rank"),
    (((TableSlice(0, 0, 3, 0, 3000),), (TableSlice(0, 0, 3, 2000), TableSlice(2, 0, 2))),
     r"Rows \[2000:3000\) of table 't0' .* are in two row bands"),
    (((TableSlice(0, 0, 3, 0, 6000),), (TableSlice(2, 0, 2),)), r"Rows \[5000:6000\) of table 't0' .* do not exist"),
    (((TableSlice(0, 0, 2, 0, 2500),), (TableSlice(0, 0, 3, 2500), TableSlice(2, 0, 2))),
     r"Columns \[2:3\) of table 't0' \(id 0, dim 3\) in rows \[0:2500\) are owned by no rank"),
])
def test_plan_validation_names_the_rows_of_a_band(rank_slices, message):
    with pytest.raises(ValueError, match=message):
        ShardingPlan(world_size=2, tables=hand_plan().tables, strategy="auto", replicated=(1,), rank_slices=rank_slices)


def test_a_grid_placement_is_refused_with_a_row_wise_optimizer():
    from tf_dlrm.embedding.optimizers import RowWiseAdagrad
    from tf_dlrm.embedding.planning import plan_tables
    from tf_dlrm.embedding.table_config import FeatureConfig, TableConfig

    grid = TableConfig("item", 8000, 8, placement="grid", optimizer=RowWiseAdagrad(0.1))
    with pytest.raises(ValueError, match=r"Tables \['item'\] cannot be placed 'grid': the model keeps row-wise optimizer state"):
        plan_tables([grid], [FeatureConfig("item", grid)], 4)
    rows = TableConfig("item", 8000, 8, placement="row_wise", optimizer=RowWiseAdagrad(0.1))
    assert plan_tables([rows], [FeatureConfig("item", rows)], 4).row_sliced == (0,)
