"""From a FeatureSpec and small config objects to a sharding plan, a built model and its readers.

Nothing here names a model: the model class comes from ``--model`` (:mod:`tf_dlrm.models.registry`)
and says which tables and features it reads (:class:`tf_dlrm.models.ranking_model.RankingModel`).
"""

from __future__ import annotations

import contextlib
import dataclasses

import keras
import numpy as np

from tf_dlrm.data.random_batches import RandomBatches
from tf_dlrm.data.reader import SplitBinaryReader
from tf_dlrm.embedding import DistributedEmbedding
from tf_dlrm.embedding import optimizers as table_optimizers
from tf_dlrm.parallel.env import DistributedEnv
from tf_dlrm.sharding.plan import ShardingPlan
from tf_dlrm.sharding.planner import make_plan, table_readers
from tf_dlrm.embedding.table_config import FeatureConfig, Placement, TableConfig, feature_tables
from tf_dlrm.optimizers.settings import OptimizerConfig
from tf_dlrm.cli.embedding_dims import check_width_mapping
from tf_dlrm.cli.model_config import ModelConfig, ShardingConfig
from tf_dlrm.spec.feature_spec import FeatureSpec
from tf_dlrm.spec.format import NUMERICAL_CHANNEL
from tf_dlrm.models import registry
from tf_dlrm.models.ranking_model import RankingModel, column_sources
from tf_dlrm.train.precision import PrecisionChoice, choose_precision


def make_tables(spec: FeatureSpec, embedding_dim: int, embedding_dims=(), embedding_widths=()) -> list[TableConfig]:
    """One table per categorical feature, named like it; its width is, first to last: the
    ``--embedding_dims`` mapping, ``--embedding_dim``'s list (one width per feature, in spec order, as
    NVIDIA's), the spec's ``embedding_dim``, ``--embedding_dim``."""
    names = spec.categorical_features
    overrides = dict(embedding_dims)
    check_width_mapping(overrides, names)
    widths = spec.embedding_dims(embedding_dim)
    if embedding_widths:
        if len(embedding_widths) != len(names):
            raise ValueError(f"Expected --embedding_dim to list one width per categorical feature of the spec "
                             f"({len(names)}). Received: {len(embedding_widths)} widths")
        widths = list(embedding_widths)
    return [TableConfig(name, rows, overrides.get(name, width)) for name, rows, width in zip(names, spec.cardinalities(), widths)]


def model_class(model: ModelConfig) -> type:
    """The class ``--model`` names (a registered name or an import path)."""
    return registry.lookup(model.name)


def model_params(model: ModelConfig):
    """The model's own hyper-parameters: ``model.params``, or its ``Config``'s defaults."""
    config_class = registry.config_class(model_class(model))
    if model.params is None:
        return config_class()
    if not isinstance(model.params, config_class):
        raise TypeError(f"Expected the hyper-parameters of --model={model.name} as a {config_class.__qualname__}. "
                        f"Received: {type(model.params).__qualname__}")
    return model.params


def model_identity(model: ModelConfig) -> dict:
    """What a checkpoint records of the model: ``name`` (its registered name or import path), ``config``
    (its hyper-parameters as JSON data) and, for messages, ``flags`` (``{config key: flag name}``)."""
    cls = model_class(model)
    if registry.is_library_model(cls):
        return {"name": registry.reference_of(cls), "config": {}, "flags": {}}
    return {"name": registry.reference_of(cls), "config": cls.config_record_of(model_params(model)), "flags": cls.flag_names()}


def model_tables(spec: FeatureSpec, model: ModelConfig) -> list[TableConfig]:
    """Every table of the model: one per categorical feature, then the model's own (DeepFM's and Wide
    & Deep's width-1 tables, :meth:`RankingModel.tables`)."""
    deep = make_tables(spec, model.embedding_dim, model.embedding_dims, model.embedding_widths)
    cls = model_class(model)
    with _users_model(model, cls, "tables"):
        tables = list(cls.tables(model_params(model), deep, spec.crossed_features))
    if not tables:
        raise ValueError(f"--model={model.name}: {cls.__qualname__}.tables() gave no embedding table. Expected at least "
                         f"one (the spec's {len(deep)} categorical features give one each). Received: tables=[]")
    return tables


@contextlib.contextmanager
def _users_model(model: ModelConfig, cls: type, what: str):
    """An error raised by a user's model (``--model=package.module:Class``) in ``what``, as one line
    naming the model and the place; tf_dlrm's own models keep their tracebacks (a bug of ours)."""
    try:
        yield
    except Exception as error:  # noqa: BLE001: whatever a user's code raises
        if not registry.is_plugin(model.name) or isinstance(error, registry.ModelError):
            raise
        raise registry.ModelError(f"--model={model.name}: {cls.__qualname__} failed in {what}: "
                                  f"{registry.where_raised(error)}") from error


def model_features(spec: FeatureSpec, model: ModelConfig) -> tuple[tuple[FeatureConfig, ...], tuple[tuple, ...]]:
    """``(features, sources)`` the model reads (:meth:`RankingModel.features`)."""
    return model_class(model).features(model_params(model), make_features(spec), spec.crossed_features)


def make_features(spec: FeatureSpec) -> tuple[FeatureConfig, ...]:
    """One feature per categorical feature of the spec, reading its own table."""
    return tuple(FeatureConfig(name=name, table=name, hotness=spec.hotness(name), ragged=spec.ragged(name),
                               combiner=spec.combiner(name), weighted=spec.weighted(name))
                 for name in spec.categorical_features)


def planned_tables(spec: FeatureSpec, model: ModelConfig) -> list[TableConfig]:
    """The tables the run's plan places: :func:`model_tables` less the dynamic ones when the spec mixes both kinds
    (a dynamic table routes its keys by hash, outside the plan). A spec of dynamic tables only keeps them all: its
    plan then describes their sizes (the memory lines and the printed plan), and no layer executes it."""
    from tf_dlrm.cli import dynamic_builder

    tables = model_tables(spec, model)
    if dynamic_builder.has_dynamic_tables(spec) and not dynamic_builder.all_dynamic(spec):
        dynamic = set(dynamic_builder.dynamic_spec.dynamic_features(spec))
        tables = [t for t in tables if t.name not in dynamic]
    return tables


def make_sharding_plan(spec: FeatureSpec, model: ModelConfig, sharding: ShardingConfig, world_size: int,
                       optimizer: OptimizerConfig | None = None) -> ShardingPlan:
    """The plan of ``sharding`` for ``world_size`` ranks. One process replicates nothing: all its
    tables are local anyway, and in one fused variable they take one gather and one sparse update
    per step instead of two, with no dense gradient of the small tables. With a row-wise embedding
    ``optimizer``, a table that several lookups per sample read stays whole
    (:func:`tf_dlrm.embedding.planning.row_wise_kept_whole`)."""
    from tf_dlrm.embedding.planning import row_wise_kept_whole, table_specs

    tables = table_specs(planned_tables(spec, model))
    names = [t.name for t in tables]
    features = [f for f in model_features(spec, model)[0] if f.table_name in set(names)]
    row_wise = optimizer is not None and table_optimizers.from_settings(optimizer).make().row_wise
    kept_whole = row_wise_kept_whole(names, features, f"--embedding_optimizer={optimizer.embedding_optimizer}" if row_wise else None)
    placements = None
    if sharding.data_parallel_elements is not None and world_size > 1:
        placements = ["replicated" if t.elements < sharding.data_parallel_elements else "auto" for t in tables]
    return make_plan(
        tables,
        world_size,
        strategy=sharding.strategy,
        data_parallel_threshold=sharding.data_parallel_threshold if world_size > 1 else 0,
        column_slice_threshold=sharding.column_slice_threshold,
        row_slice_threshold=sharding.row_slice_threshold,
        readers=table_readers(feature_tables(features, names), len(tables)),
        placements=placements,
        kept_whole=kept_whole,
    )


def check_memory_plan(plan: ShardingPlan, optimizer_config, hot=None, budget: int = 0, hot_row_sync_every: int = 1,
                      limits=()) -> list:
    """Every rank's planned bytes (:func:`tf_dlrm.sharding.memory_plan.plan_memory`) under the
    embedding optimizer of ``optimizer_config``; raises ValueError naming ``--memory_per_rank`` when a
    rank needs more than ``budget`` (0: no budget), and naming the limit when the ranks sharing one of
    ``limits`` (:func:`tf_dlrm.parallel.host_memory.groups`: hosts' RAM, memory cgroups) need more than
    it has. Per-table optimizers (Wide & Deep's wide part) are counted as the embedding optimizer."""
    from tf_dlrm.sharding.memory_plan import check_budget, check_limits, plan_memory

    optimizer = table_optimizers.from_settings(optimizer_config).make()
    slots = len(optimizer.slots)
    hot_counts = {rows.table: rows.count for rows in hot.tables} if hot is not None and plan.world_size > 1 else {}
    memory = plan_memory(plan, 0 if optimizer.row_wise else slots, slots if optimizer.row_wise else 0, hot_counts,
                         hot_copies=2 if hot_row_sync_every > 1 else 1)
    check_budget(memory, budget)
    check_limits(memory, limits)
    return memory


def check_dense_memory(memory: list, trainer, budget: int = 0) -> list:
    """``memory`` with the built model's dense weights and their optimizer state (every rank holds both
    whole); raises ValueError naming ``--memory_per_rank`` when a rank then needs more than ``budget``."""
    import tensorflow as tf

    from tf_dlrm.sharding.memory_plan import check_budget, with_dense

    def size(variables) -> int:
        return sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in variables)

    dense = size(trainer.mlp)
    # The optimizer's own scalars (iterations, learning rate) are counted too: a few bytes.
    memory = with_dense(memory, dense, size(trainer.dense_optimizer.variables))
    check_budget(memory, budget)
    return memory


def make_table_configs(spec: FeatureSpec, plan: ShardingPlan, config: ModelConfig, optimizer: OptimizerConfig | None = None,
                       hot_rows: dict | None = None, split_embedding_tables: bool = False) -> list[TableConfig]:
    """The model's tables as the embedding library's :class:`TableConfig` objects: rows and widths from
    the spec and ``--embedding_dim(s)``, ``--embedding_init``, the model's own per-table optimizers
    (Wide & Deep's ``--wide_optimizer``: the others take ``--embedding_optimizer``, ``optimizer=None``),
    ``--embedding_min_count`` and ``--embedding_frequency_l2`` (every table's frequency regularizer),
    ``hot_rows`` (``{table index: ids}``, ``--hot_rows_budget``) and split bfloat16 storage of the
    model-parallel tables (``--split_embedding_tables``) as placements."""
    tables = model_tables(spec, config)
    chosen = model_class(config).table_optimizers(model_params(config), tables, len(spec.categorical_features))
    if optimizer is not None:  # the run's hyper-parameters (--adagrad_*, --adam_*) for the model's choices
        chosen = {t: table_optimizers.from_settings(optimizer, o.name, o.learning_rate) for t, o in chosen.items()}
    model_parallel = set(plan.model_parallel) if plan is not None else set()
    return [dataclasses.replace(table, initializer=config.table_initializer, optimizer=chosen.get(t),
                                frequency_regularizer=config.frequency_regularizer,
                                placement=Placement(hot_rows=tuple((hot_rows or {}).get(t, ())),
                                                    storage="split_bfloat16" if split_embedding_tables and t in model_parallel
                                                    else "float32"))
            for t, table in enumerate(tables)]


def make_embedding(spec: FeatureSpec, plan: ShardingPlan | None, config: ModelConfig, env: DistributedEnv, seed: int,
                   data_parallel_input: bool = False, deduplicate_exchange: bool = False, hot_rows: dict | None = None,
                   split_embedding_tables: bool = False, num_shards: int | None = None,
                   optimizer: OptimizerConfig | None = None):
    """The unbuilt embedding layer of the model of ``config``, executing ``plan`` on ``env.rank``.

    Fixed tables: a :class:`DistributedEmbedding` over :func:`make_table_configs`' tables (the same
    layer and configs a user's own model holds); a model that derives features from the columns
    (DeepFM's and Wide & Deep's width-1 features) reads the local batch of every column. Dynamic tables
    (:mod:`tf_dlrm.cli.dynamic_builder`): the plan then only describes their sizes; ``num_shards``:
    the shards of every table, default the world size."""
    from tf_dlrm.cli import dynamic_builder

    features, sources = model_features(spec, config)
    derived = tuple(sources) != column_sources(len(spec.categorical_features))
    dynamic = dynamic_builder.has_dynamic_tables(spec)
    for flag, used in (("--deduplicate_exchange", deduplicate_exchange), ("--hot_rows_budget", bool(hot_rows)),
                       ("--split_embedding_tables", split_embedding_tables)):
        if used and (derived or dynamic):
            what = "dynamic tables" if dynamic else f"--model={config.name}, which derives features from the columns"
            raise ValueError(f"{flag} is implemented for models that read the spec's columns as they are, on fixed "
                             f"tables (e.g. --model=dlrm). Received: {what}")
    if dynamic and derived:
        raise ValueError(f"Dynamic tables are built for models that read the spec's columns as they are (e.g. "
                         f"--model=dlrm). Received: --model={config.name}, which derives features from the columns")
    if dynamic and dynamic_builder.all_dynamic(spec):
        widths = [table.embedding_dim for table in model_tables(spec, config)]  # the model may choose its tables' widths
        return dynamic_builder.make_dynamic_embedding(spec, features, config.table_initializer, env, seed, widths,
                                                      num_shards=num_shards)
    tables = {t.name: t for t in make_table_configs(spec, plan, config, optimizer, hot_rows, split_embedding_tables)}
    features = [dataclasses.replace(f, table=tables[f.table_name]) for f in features]
    if dynamic:  # fixed tables under the plan beside dynamic ones
        widths = [table.embedding_dim for table in model_tables(spec, config)]
        return dynamic_builder.make_dynamic_embedding(spec, features, config.table_initializer, env, seed, widths,
                                                      plan=plan, num_shards=num_shards)
    return DistributedEmbedding(features, plan=plan, env=env, seed=seed, data_parallel_input=data_parallel_input or derived,
                                deduplicate_exchange=deduplicate_exchange, name="embedding")


def build_model(
    spec: FeatureSpec, plan: ShardingPlan | None, config: ModelConfig, env: DistributedEnv, seed: int,
    data_parallel_input: bool = False, deduplicate_exchange: bool = False, hot_rows: dict | None = None,
    split_embedding_tables: bool = False, serving: bool = False, num_shards: int | None = None,
    optimizer: OptimizerConfig | None = None,
) -> RankingModel:
    """The built model of ``config`` (``--model`` and its hyper-parameters) on :func:`make_embedding`'s layer.

    Built from its widths; ``serving`` builds it by one call instead, which also records the input
    signature a SavedModel export serves."""
    embedding = make_embedding(spec, plan, config, env, seed, data_parallel_input, deduplicate_exchange, hot_rows,
                               split_embedding_tables, num_shards, optimizer)
    cls = model_class(config)
    with _users_model(config, cls, "its construction or build"):
        model = cls(embedding, len(spec.numerical_features), num_categorical=len(spec.categorical_features),
                    seed=seed, config=model_params(config), sources=model_features(spec, config)[1])
        if serving:
            build_with_dummy_batch(model, len(spec.numerical_features), embedding, env.world_size)
        else:  # no eager forward (op by op, with the exchange's collectives) only to create the weights
            model.build(None)
    return model


def build_library_model(spec: FeatureSpec, config: ModelConfig, env: DistributedEnv, seed: int):
    """A user's :class:`tf_dlrm.embedding.Model` (``--model=package.module:Name``, see
    :func:`tf_dlrm.models.registry.is_library_model`), made and built on this rank: its one
    embedding layer's features must be named like the spec's categorical features (their ids, as the
    reader yields them) and its tables place themselves (their :class:`TableConfig` placements, planned
    for this run's ranks). Dense weights are created by one call on a batch of zeros."""
    import inspect

    import keras

    from tf_dlrm.embedding.model import Model
    from tf_dlrm.embedding.training_step import embedding_layers

    factory = model_class(config)
    keras.utils.set_random_seed(seed)  # the same dense initial weights on every rank (rank 0's are broadcast too)
    with _users_model(config, factory, "its construction"):
        takes_spec = "feature_spec" in inspect.signature(factory).parameters
        model = factory(feature_spec=spec) if takes_spec else factory()
    if not isinstance(model, Model):
        raise registry.ModelError(f"--model={config.name}: expected a tf_dlrm.embedding.Model. Received: {type(model).__qualname__}")
    layers = embedding_layers(model)
    if len(layers) != 1:
        raise registry.ModelError(f"--model={config.name}: expected one DistributedEmbedding in the model (main.py "
                                  f"checkpoints one layer's tables). Received: {len(layers)}")
    layer = layers[0]
    if layer.env.world_size != env.world_size:
        raise registry.ModelError(f"--model={config.name}: its DistributedEmbedding was made for {layer.env.world_size} "
                                  f"rank(s), the run has {env.world_size}: leave its env out (Horovod's is the default)")
    names = list(spec.categorical_features)
    unknown = [f.name for f in layer.output_features if f.name not in names]
    if unknown:
        raise registry.ModelError(f"--model={config.name}: features {unknown} are not categorical features of "
                                  f"{spec.source}. Expected feature names among {names}")
    if NUMERICAL_CHANNEL in names:
        raise ValueError(f"{spec.source}: a categorical feature is named {NUMERICAL_CHANNEL!r}, the key of the "
                         "numerical features in a model's input; rename it")
    with _users_model(config, factory, "its first call"):
        model.build()
        model(zero_batch(model.input_modes, layer, len(spec.numerical_features), 1, env.world_size))
    return model


def check_library_sharding(name: str, sharding: ShardingConfig) -> None:
    """Refuses main.py's table-layout flags for a library model, whose tables say their own placement."""
    given = [flag for flag, used in (("--data_parallel_input", sharding.data_parallel_input),
                                     ("--deduplicate_exchange", sharding.deduplicate_exchange),
                                     ("--hot_rows_budget", bool(sharding.hot_rows_budget)),
                                     ("--split_embedding_tables", sharding.split_embedding_tables)) if used]
    if given:
        raise ValueError(f"{', '.join(given)} lay out the tables main.py makes from the spec; --model={name} makes its "
                         "own: give its TableConfig a Placement (hot_rows=, storage=) and its DistributedEmbedding "
                         "data_parallel_input= or deduplicate_exchange= instead")


def build_with_dummy_batch(model: RankingModel, num_numerical: int, embedding, world_size: int, local_batch: int = 1) -> None:
    """Creates all weights by calling the model once on zeros shaped like a real batch (Keras then also
    records the input signature that a SavedModel export serves)."""
    if not embedding.built:
        # Built here, eagerly: inside the model's first (symbolic) call Keras would defer the tables'
        # initialisation, which then needs a second full copy of each shard.
        embedding.build()
    model(zero_batch(model.input_modes, embedding, num_numerical, local_batch, world_size))


def zero_batch(input_modes, embedding, num_numerical: int, local_batch: int, world_size: int) -> dict:
    """A batch of zeros shaped as a reader gives it for ``input_modes`` (ids of the global batch or the local one)."""
    hotness = {f.name: f.hotness for f in embedding.output_features}
    weighted = {f.name for f in embedding.output_features if f.weighted}
    batch = {NUMERICAL_CHANNEL: np.zeros([local_batch, num_numerical], np.float32)}
    for name, mode in input_modes.items():
        rows = local_batch * world_size if mode == "global" else local_batch
        if name != NUMERICAL_CHANNEL:
            shape = [rows] if hotness.get(name, 1) == 1 else [rows, hotness[name]]
            batch[name] = np.zeros(shape, np.int32)
            if name in weighted:  # as the reader names a weighted column's weights
                batch[f"{name}_weights"] = np.zeros(shape, np.float32)
    return batch


def make_reader(
    spec: FeatureSpec, split: str, global_batch_size: int, env: DistributedEnv, input_modes, training: bool, seed: int,
    dataset_type: str = "tf_raw", synthetic_batches: int = 64,
):
    """The reader of one split for this rank: split_binary files, or random in-memory batches;
    ``input_modes``: what the model reads here (``model.input_modes``)."""
    if dataset_type == "split_tfrecords":
        from tf_dlrm.data.split_tfrecords import SplitTFRecordsReader

        return SplitTFRecordsReader(spec, split, global_batch_size, rank=env.rank, world_size=env.world_size,
                                    input_modes=input_modes)
    if dataset_type == "synthetic":
        return RandomBatches(
            spec, synthetic_batches * global_batch_size, global_batch_size, rank=env.rank, world_size=env.world_size,
            input_modes=input_modes, seed=seed if training else seed + 1,
        )
    return SplitBinaryReader(
        spec,
        split,
        global_batch_size,
        rank=env.rank,
        world_size=env.world_size,
        input_modes=input_modes,
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
