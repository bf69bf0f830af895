"""A model is accepted or refused the same way on any number of ranks: generated models (every table optimizer x
every placement x how the table is read: one-hot, fixed multi-hot, ragged, shared by two features), each beside
a table the planner may cut, a replicated table and a dynamic table, on N = 1..4. Each is either refused when its
layer is built, with the same message on every N, or planned, built on every rank, and accepted by the training
step's sparse update (which refuses row-wise state it could not keep exact). That the accepted models also train
to one process's weights is tests/embedding/test_custom_model.py's (the hardest one, on 2, 3 and 4 ranks) and
tests/embedding/test_equivalence.py's."""

from __future__ import annotations

import itertools

import pytest

from tf_dlrm.embedding import DistributedEmbedding, DynamicStorage, FeatureConfig, Placement, TableConfig, optimizers
from tf_dlrm.embedding.sparse_update import SparseUpdater
from tf_dlrm.embedding.training_step import table_optimizer_groups
from tf_dlrm.parallel.env import DistributedEnv

OPTIMIZERS = {
    "sgd": optimizers.SGD(learning_rate=0.1),
    "adagrad": optimizers.Adagrad(learning_rate=0.1),
    "rowwise_adagrad": optimizers.RowWiseAdagrad(learning_rate=0.1),
    "lazy_adam": optimizers.LazyAdam(learning_rate=0.01),
    "catch_up_adam": optimizers.CatchUpAdam(learning_rate=0.01),
    "dense_adam": optimizers.DenseAdam(learning_rate=0.01),
    "ftrl": optimizers.FTRL(learning_rate=0.1),
}
PLACEMENTS = ("auto", "table_wise", "column_wise", "row_wise", "grid", "replicated")
READERS = ("one_hot", "multi_hot", "ragged", "shared")


def features_of(optimizer: str, placement: str, readers: str) -> list[FeatureConfig]:
    table = TableConfig("target", 3000, 8, optimizer=OPTIMIZERS[optimizer], placement=placement)
    # Larger than the target: under "auto" the planner cuts it to fill the ranks.
    wide = TableConfig("wide", 20000, 8, optimizer=optimizers.Adagrad(learning_rate=0.1))
    small = TableConfig("small", 10, 8, optimizer=optimizers.SGD(learning_rate=0.1), placement="replicated")
    keys = TableConfig("keys", 1, 8, optimizer=optimizers.RowWiseAdagrad(learning_rate=0.1),
                       placement=Placement(dynamic=DynamicStorage(capacity=64)))
    target = {
        "one_hot": [FeatureConfig("a", table)],
        "multi_hot": [FeatureConfig("a", table, hotness=3)],
        "ragged": [FeatureConfig("a", table, hotness=5, ragged=True)],
        "shared": [FeatureConfig("a", table), FeatureConfig("b", table, hotness=5, ragged=True)],
    }[readers]
    return target + [FeatureConfig("w", wide), FeatureConfig("s", small), FeatureConfig("k", keys)]


def outcome(features, world_size: int):
    """The message of the refusal, or ``(slices, row bands)`` of the target table (after every rank built its
    layer and its sparse update)."""
    slices = None
    for rank in range(world_size):
        env = DistributedEnv(rank=rank, world_size=world_size)
        try:
            layer = DistributedEmbedding(features, env=env)
        except ValueError as error:
            return str(error)
        layer.build()
        sparse_optimizer, table_optimizers, _ = table_optimizer_groups([layer])
        SparseUpdater(sparse_optimizer, env, layer.sparse_variables, layer.replicated_variables, layer.padding_variables,
                      table_optimizers=table_optimizers)  # raises on row-wise state it could not keep exact
        slices = (len(layer.plan.table_slices(0)), len(layer.plan.row_bands(0)))
    return slices


# The unit tier keeps a row-wise optimizer at every placement and an element-wise one where the planner may cut
# the table's columns; `make test` runs them all.
UNIT_TIER = {"rowwise_adagrad": PLACEMENTS, "sgd": ("auto", "column_wise")}
CASES = [pytest.param(optimizer, placement,
                      marks=() if placement in UNIT_TIER.get(optimizer, ()) else pytest.mark.slow)
         for optimizer, placement in itertools.product(OPTIMIZERS, PLACEMENTS)]


@pytest.mark.parametrize("optimizer, placement", CASES)
def test_a_model_is_accepted_or_refused_the_same_way_on_every_n(optimizer, placement):
    for readers in READERS:
        features = features_of(optimizer, placement, readers)
        outcomes = {n: outcome(features, n) for n in (1, 2, 3, 4)}
        refused = {n: o for n, o in outcomes.items() if isinstance(o, str)}
        # The dynamic table's row-wise Adagrad makes row-wise state the step's: every table a sample looks
        # up several times stays whole, whatever its own optimizer.
        row_wise_several = readers != "one_hot"
        if refused and placement == "grid":
            # Row-wise state is exact on bands or on column slices, not both: a grid is refused on every N.
            assert len(refused) == 4 and len(set(refused.values())) == 1, (readers, outcomes)
            assert refused[1].startswith("Tables ['target'] cannot be placed 'grid': the model keeps row-wise optimizer state"), refused
            continue
        if refused:
            assert len(refused) == 4 and len(set(refused.values())) == 1, (readers, outcomes)
            assert placement == "column_wise" and row_wise_several, (readers, outcomes)
            message = refused[1]
            assert message.startswith("Table 'target' cannot be placed column_wise: the model keeps row-wise optimizer "
                                      "state (table '"), message
            assert "is read by 'a' (" in message, message
            assert "placement='auto'" in message and "--" not in message, message
            continue
        if placement == "replicated":
            assert set(outcomes.values()) == {(0, 0)}, (readers, outcomes)  # on every rank, no slice
        elif placement == "row_wise":
            assert outcomes == {n: (n, n) for n in (1, 2, 3, 4)}, (readers, outcomes)  # rows whole: allowed
        elif row_wise_several:
            # Kept whole: its columns never cut (auto may cut its rows into bands, each row whole on one rank).
            assert all(slices == bands for slices, bands in outcomes.values()), (readers, outcomes)
        elif placement == "column_wise":
            assert outcomes == {1: (1, 1), 2: (2, 1), 3: (3, 1), 4: (4, 1)}, (readers, outcomes)


def test_the_planner_still_cuts_a_row_wise_table_one_one_hot_feature_reads():
    """Kept whole only where needed: one one-hot reader keeps row-wise state exact on slices."""
    features = features_of("rowwise_adagrad", "column_wise", "one_hot")
    assert [outcome(features, n) for n in (1, 2, 3, 4)] == [(1, 1), (2, 1), (3, 1), (4, 1)]
