"""From a FeatureSpec and small config objects to a sharding plan, a built DLRM and its readers."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import keras
import numpy as np

from tf_dlrm.data.random_batches import RandomBatches
from tf_dlrm.data.reader import SplitBinaryReader
from tf_dlrm.distributed.embedding import DistributedEmbedding
from tf_dlrm.distributed.env import DistributedEnv
from tf_dlrm.distributed.plan import ShardingPlan, Strategy, TableSpec
from tf_dlrm.distributed.planner import make_plan
from tf_dlrm.config.embedding import FeatureConfig, check_width_mapping
from tf_dlrm.feature_spec import FeatureSpec
from tf_dlrm.model.dlrm import DLRM
from tf_dlrm.model.interaction import InteractionKind
from tf_dlrm.precision import PrecisionChoice, choose_precision


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    embedding_dim: int = 128
    bottom_mlp_dims: tuple[int, ...] = (512, 256, 128)
    top_mlp_dims: tuple[int, ...] = (1024, 1024, 512, 256, 1)
    interaction: str = "dot"
    include_diagonal: bool = False
    # Per-table widths overriding embedding_dim and the spec's own: ((table name, width), ...).
    embedding_dims: tuple[tuple[str, int], ...] = ()

    def __post_init__(self):
        if self.embedding_dim <= 0:
            raise ValueError(f"Expected --embedding_dim > 0. Received: embedding_dim={self.embedding_dim}")
        for name in ("bottom_mlp_dims", "top_mlp_dims"):
            dims = getattr(self, name)
            if not dims or any(d <= 0 for d in dims):
                raise ValueError(f"Expected --{name} to be positive widths. Received: {name}={list(dims)}")
        if self.top_mlp_dims[-1] != 1:
            raise ValueError(f"Expected --top_mlp_dims to end with 1 (the logit). Received: {list(self.top_mlp_dims)}")
        if self.interaction not in [k.value for k in InteractionKind]:
            raise ValueError(f"Expected --interaction in {[k.value for k in InteractionKind]}. Received: {self.interaction!r}")
        if self.interaction == "dot" and self.bottom_mlp_dims[-1] != self.embedding_dim:
            raise ValueError(
                "The dot interaction needs the bottom MLP's last width to equal the embedding dim. "
                f"Received: --bottom_mlp_dims={','.join(map(str, self.bottom_mlp_dims))}, --embedding_dim={self.embedding_dim}"
            )


@dataclasses.dataclass(frozen=True)
class ShardingConfig:
    strategy: str = Strategy.AUTO.value
    data_parallel_threshold: int = 2048
    column_slice_threshold: int | None = None
    data_parallel_input: bool = False


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


def make_features(spec: FeatureSpec) -> tuple[FeatureConfig, ...]:
    """One feature per categorical feature of the spec, reading its own table."""
    return tuple(FeatureConfig(name=name, table=name, hotness=spec.hotness(name), combiner=spec.combiner(name))
                 for name in spec.categorical_features)


def make_sharding_plan(spec: FeatureSpec, model: ModelConfig, sharding: ShardingConfig, world_size: int) -> ShardingPlan:
    """The plan of ``sharding`` for ``world_size`` ranks. One process replicates nothing: all its
    tables are local anyway, and in one fused variable they take one gather and one sparse update
    per step instead of two, with no dense gradient of the small tables."""
    return make_plan(
        make_tables(spec, model.embedding_dim, model.embedding_dims),
        world_size,
        strategy=sharding.strategy,
        data_parallel_threshold=sharding.data_parallel_threshold if world_size > 1 else 0,
        column_slice_threshold=sharding.column_slice_threshold,
    )


def build_model(
    spec: FeatureSpec, plan: ShardingPlan, config: ModelConfig, env: DistributedEnv, seed: int, data_parallel_input: bool = False
) -> DLRM:
    """A built DLRM whose embedding executes ``plan`` on ``env.rank`` (dynamic tables: see
    :mod:`tf_dlrm.dynamic.builder`; the plan then only describes their sizes)."""
    from tf_dlrm.dynamic import builder as dynamic_builder

    if dynamic_builder.has_dynamic_tables(spec):
        model = dynamic_builder.make_dynamic_model(spec, config, env, seed, table_widths(spec, config))
        build_with_dummy_batch(model, len(spec.numerical_features), model.embedding, env.world_size)
        return model
    embedding = DistributedEmbedding(plan, rank=env.rank, seed=seed, data_parallel_input=data_parallel_input,
                                     features=make_features(spec), name="embedding")
    model = DLRM(
        embedding,
        num_numerical=len(spec.numerical_features),
        bottom_mlp_dims=config.bottom_mlp_dims,
        top_mlp_dims=config.top_mlp_dims,
        interaction=config.interaction,
        include_diagonal=config.include_diagonal,
        seed=seed,
    )
    build_with_dummy_batch(model, len(spec.numerical_features), embedding, env.world_size)
    return model


def build_with_dummy_batch(model: DLRM, num_numerical: int, embedding, world_size: int, local_batch: int = 1) -> None:
    """Creates all weights by calling the model once on zeros shaped like a real batch."""
    global_batch = local_batch * world_size

    def zeros(feature: int, rows: int):
        hotness = embedding.features[feature].hotness if hasattr(embedding, "features") else 1
        return np.zeros([rows] if hotness == 1 else [rows, hotness], np.int32)

    categorical = [zeros(f, global_batch) for f in embedding.global_categorical]
    categorical += [zeros(f, local_batch) for f in embedding.local_categorical]
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
    """Makes ``choice`` (see :func:`tf_dlrm.precision.choose_precision`) Keras' global policy."""
    keras.mixed_precision.set_global_policy(choice.policy)
    return choice


def parse_dims(text: str | Sequence[int], flag: str) -> tuple[int, ...]:
    if not isinstance(text, str):
        return tuple(int(x) for x in text)
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"Expected --{flag} as comma-separated integers, e.g. 512,256,128. Received: {text!r}") from None
