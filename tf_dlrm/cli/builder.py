"""From a FeatureSpec and small config objects to a sharding plan, a built DLRM and its readers."""

from __future__ import annotations

import keras
import numpy as np

from tf_dlrm.data.random_batches import RandomBatches
from tf_dlrm.data.reader import SplitBinaryReader
from tf_dlrm.embedding import DistributedEmbedding
from tf_dlrm.distributed.env import DistributedEnv
from tf_dlrm.distributed.plan import ShardingPlan, TableSpec
from tf_dlrm.distributed.planner import make_plan, table_readers
from tf_dlrm.config.embedding import check_width_mapping
from tf_dlrm.embedding.table_config import FeatureConfig, feature_tables
from tf_dlrm.config.model_tables import family_features, family_tables
# The configs live in a TF-free module (flags parse into them); kept importable from here.
from tf_dlrm.config.model import ModelConfig, ShardingConfig, parse_dims  # noqa: F401
from tf_dlrm.feature_spec import FeatureSpec
from tf_dlrm.model.dlrm import DLRM
from tf_dlrm.precision import PrecisionChoice, choose_precision


def make_tables(spec: FeatureSpec, embedding_dim: int, embedding_dims=()) -> list[TableSpec]:
    """One table per categorical feature, named like it; its width is, first to last: the
    ``--embedding_dims`` mapping, the spec's ``embedding_dim``, ``--embedding_dim``."""
    names = spec.categorical_features
    overrides = dict(embedding_dims)
    check_width_mapping(overrides, names)
    widths = spec.embedding_dims(embedding_dim)
    return [TableSpec(name, rows, overrides.get(name, width)) for name, rows, width in zip(names, spec.cardinalities(), widths)]


def table_widths(spec: FeatureSpec, model: ModelConfig) -> list[int]:
    """The width of every table (see :func:`make_tables`)."""
    return [table.dim for table in make_tables(spec, model.embedding_dim, model.embedding_dims)]


def model_tables(spec: FeatureSpec, model: ModelConfig) -> list[TableSpec]:
    """Every table of the model: one per categorical feature, then the width-1 tables of DeepFM and
    Wide & Deep (:func:`tf_dlrm.models.tables.family_tables`)."""
    return family_tables(make_tables(spec, model.embedding_dim, model.embedding_dims), model.family, spec.crossed_features)


def make_features(spec: FeatureSpec) -> tuple[FeatureConfig, ...]:
    """One feature per categorical feature of the spec, reading its own table."""
    return tuple(FeatureConfig(name=name, table=name, hotness=spec.hotness(name), combiner=spec.combiner(name))
                 for name in spec.categorical_features)


def make_sharding_plan(spec: FeatureSpec, model: ModelConfig, sharding: ShardingConfig, world_size: int) -> ShardingPlan:
    """The plan of ``sharding`` for ``world_size`` ranks. One process replicates nothing: all its
    tables are local anyway, and in one fused variable they take one gather and one sparse update
    per step instead of two, with no dense gradient of the small tables."""
    tables = model_tables(spec, model)
    features, _ = family_features(make_features(spec), model.family, spec.crossed_features)
    return make_plan(
        tables,
        world_size,
        strategy=sharding.strategy,
        data_parallel_threshold=sharding.data_parallel_threshold if world_size > 1 else 0,
        column_slice_threshold=sharding.column_slice_threshold,
        readers=table_readers(feature_tables(features, [t.name for t in tables]), len(tables)),
    )


def check_memory_plan(plan: ShardingPlan, optimizer_config, hot=None, budget: int = 0, hot_row_sync_every: int = 1) -> list:
    """Every rank's planned bytes (:func:`tf_dlrm.sharding.memory_plan.plan_memory`) under the
    embedding optimizer of ``optimizer_config``; raises ValueError naming ``--memory_per_rank`` when a
    rank needs more than ``budget`` (0: no budget). Per-table optimizers (Wide & Deep's wide part)
    are counted as the embedding optimizer."""
    from tf_dlrm.sharding.memory_plan import check_budget, plan_memory
    from tf_dlrm.optimizers.config import make_sparse_optimizer

    optimizer = make_sparse_optimizer(optimizer_config)
    slots = len(optimizer.slots)
    hot_counts = {rows.table: rows.count for rows in hot.tables} if hot is not None and plan.world_size > 1 else {}
    memory = plan_memory(plan, 0 if optimizer.row_wise else slots, slots if optimizer.row_wise else 0, hot_counts,
                         hot_copies=2 if hot_row_sync_every > 1 else 1)
    check_budget(memory, budget)
    return memory


def build_model(
    spec: FeatureSpec, plan: ShardingPlan, config: ModelConfig, env: DistributedEnv, seed: int, data_parallel_input: bool = False,
    deduplicate_exchange: bool = False, hot_rows: dict | None = None, split_embedding_tables: bool = False,
    serving: bool = False,
) -> DLRM:
    """A built model of ``config.family`` (DLRM by default) whose embedding executes ``plan`` on ``env.rank``
    (dynamic tables: see :mod:`tf_dlrm.cli.dynamic_builder`; the plan then only describes their sizes).

    A DLRM is built from its widths; ``serving`` builds it by one call instead, which also records the
    input signature a SavedModel export serves."""
    from tf_dlrm.cli import dynamic_builder

    for flag, used in (("--deduplicate_exchange", deduplicate_exchange), ("--hot_rows_budget", bool(hot_rows)),
                       ("--split_embedding_tables", split_embedding_tables)):
        if used and (config.family.model != "dlrm" or dynamic_builder.has_dynamic_tables(spec)):
            what = "dynamic tables" if config.family.model == "dlrm" else f"--model={config.family.model}"
            raise ValueError(f"{flag} is implemented for --model=dlrm with fixed tables only. Received: {what}")

    if dynamic_builder.has_dynamic_tables(spec):
        if config.family.model != "dlrm":
            raise ValueError(f"Dynamic tables are built for --model=dlrm only for now. Received: --model={config.family.model}")
        model = dynamic_builder.make_dynamic_model(spec, config, env, seed, table_widths(spec, config))
        model.build(None)
        return model
    if config.family.model != "dlrm":
        from tf_dlrm.models import build_family_model

        model = build_family_model(config.family, make_features(spec), spec.crossed_features, plan,
                                   len(spec.numerical_features), env.rank, seed, data_parallel_input,
                                   init_bound=config.embedding_init_bound)
        if serving:
            build_with_dummy_batch(model, len(spec.numerical_features), model.embedding, env.world_size)
        else:
            model.build(None)
        return model
    embedding = DistributedEmbedding.from_plan(plan, rank=env.rank, seed=seed, data_parallel_input=data_parallel_input,
                                     features=make_features(spec), deduplicate_exchange=deduplicate_exchange,
                                     hot_rows=hot_rows, split_embedding_tables=split_embedding_tables,
                                     init_bound=config.embedding_init_bound, name="embedding")
    model = DLRM(
        embedding,
        num_numerical=len(spec.numerical_features),
        bottom_mlp_dims=config.bottom_mlp_dims,
        top_mlp_dims=config.top_mlp_dims,
        interaction=config.interaction,
        include_diagonal=config.include_diagonal,
        seed=seed,
    )
    if serving:
        build_with_dummy_batch(model, len(spec.numerical_features), embedding, env.world_size)
    else:  # no eager forward (op by op, with the exchange's collectives) only to create the weights
        model.build(None)
    return model


def build_with_dummy_batch(model: DLRM, num_numerical: int, embedding, world_size: int, local_batch: int = 1) -> None:
    """Creates all weights by calling the model once on zeros shaped like a real batch (Keras then also
    records the input signature that a SavedModel export serves)."""
    global_batch = local_batch * world_size

    def zeros(feature: int, rows: int):
        hotness = embedding.features[feature].hotness if hasattr(embedding, "features") else 1
        return np.zeros([rows] if hotness == 1 else [rows, hotness], np.int32)

    categorical = [zeros(f, global_batch) for f in embedding.global_categorical]
    categorical += [zeros(f, local_batch) for f in embedding.local_categorical]
    if not embedding.built:
        # Built here, eagerly: inside the model's first (symbolic) call Keras would defer the tables'
        # initialisation, which then needs a second full copy of each shard.
        embedding.build()
    model((np.zeros([local_batch, num_numerical], np.float32), tuple(categorical)))


def make_reader(
    spec: FeatureSpec, split: str, global_batch_size: int, env: DistributedEnv, embedding, training: bool, seed: int,
    dataset_type: str = "tf_raw", synthetic_batches: int = 64,
):
    """The reader of one split for this rank: split_binary files, or random in-memory batches."""
    if dataset_type == "split_tfrecords":
        from tf_dlrm.data.split_tfrecords import SplitTFRecordsReader

        return SplitTFRecordsReader(spec, split, global_batch_size, rank=env.rank, world_size=env.world_size,
                                    global_categorical=embedding.global_categorical,
                                    local_categorical=embedding.local_categorical)
    if dataset_type == "synthetic":
        return RandomBatches(
            spec, synthetic_batches * global_batch_size, global_batch_size, rank=env.rank, world_size=env.world_size,
            global_categorical=embedding.global_categorical, local_categorical=embedding.local_categorical,
            seed=seed if training else seed + 1,
        )
    return SplitBinaryReader(
        spec,
        split,
        global_batch_size,
        rank=env.rank,
        world_size=env.world_size,
        global_categorical=embedding.global_categorical,
        local_categorical=embedding.local_categorical,
        last_batch="drop" if training else "pad",
        shuffle=training,
        seed=seed,
    )


def set_precision(amp, on_gpu: bool) -> str:
    """Sets the Keras global policy that ``--amp=amp`` (true, false or auto) picks here; returns it."""
    return apply_precision(choose_precision(amp, on_gpu)).policy


def apply_precision(choice: PrecisionChoice) -> PrecisionChoice:
    """Makes ``choice`` (see :func:`tf_dlrm.train.precision.choose_precision`) Keras' global policy."""
    keras.mixed_precision.set_global_policy(choice.policy)
    return choice
