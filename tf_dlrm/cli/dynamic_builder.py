"""The dynamic tables of a feature spec (``main.py`` builds them through
:func:`tf_dlrm.cli.builder.make_embedding` when the spec has ``dynamic: true`` features): the same
:class:`DistributedEmbedding` as every other run, those tables placed as dynamic. A spec may mix them with
fixed tables (the layer then exchanges the fixed ones under the run's plan and routes the dynamic ones' keys
by hash); a dynamic feature may be one-hot, multi-hot or ragged, pooled by its ``combiner`` like a fixed one."""

from __future__ import annotations

import dataclasses

from tf_dlrm.embedding.distributed_embedding import DistributedEmbedding
from tf_dlrm.embedding.table_config import DynamicStorage, FeatureConfig, Placement, TableConfig
from tf_dlrm.parallel.env import DistributedEnv
from tf_dlrm.spec import dynamic as dynamic_spec


def has_dynamic_tables(spec) -> bool:
    return bool(dynamic_spec.dynamic_features(spec))


def all_dynamic(spec) -> bool:
    """Whether every categorical feature of ``spec`` is dynamic (the layer is then its dynamic tables alone)."""
    return len(dynamic_spec.dynamic_features(spec)) == len(spec.categorical_features)


def dynamic_table_configs(spec, initializer, widths) -> list[TableConfig]:
    """One dynamic :class:`TableConfig` per dynamic categorical feature, named after it, in channel order;
    ``initializer``: ``--embedding_init``'s (``"uniform_sqrt_rows"``: new rows uniform in ``1/sqrt(capacity)``);
    ``widths``: the width of each categorical feature's table (every feature's, fixed ones too)."""
    tables = []
    for name, width in zip(spec.categorical_features, widths):
        properties = spec.feature_spec[name]
        if not dynamic_spec.is_dynamic(properties):
            continue
        storage = DynamicStorage(capacity=int(properties["capacity"]), eviction=properties.get("eviction", "none"),
                                 min_count=int(properties.get("min_count", 1)),
                                 capacity_scope=properties.get("capacity_scope", "per_rank"),
                                 max_idle_steps=properties.get("max_idle_steps"))
        tables.append(TableConfig(name, storage.capacity, int(width), initializer=initializer,
                                  placement=Placement(dynamic=storage)))
    return tables


def with_dynamic_tables(spec, features, initializer, widths) -> list[FeatureConfig]:
    """``features`` (one per categorical feature, each holding its fixed table) with every dynamic feature's table
    replaced by its dynamic :class:`TableConfig` (:func:`dynamic_table_configs`)."""
    tables = {table.name: table for table in dynamic_table_configs(spec, initializer, widths)}
    return [dataclasses.replace(f, table=tables[f.name]) if f.name in tables else f for f in features]


def make_dynamic_embedding(spec, features, initializer, env: DistributedEnv, seed: int, widths, plan=None,
                           num_shards: int | None = None) -> DistributedEmbedding:
    """The (unbuilt) embedding of ``features`` (:func:`with_dynamic_tables`' arguments) with the dynamic ones on
    their dynamic tables; ``plan``: the fixed tables' plan (None when every table is dynamic); ``num_shards``:
    shards of every dynamic table (default: the world size; export holds a checkpoint's shards in one process)."""
    features = with_dynamic_tables(spec, features, initializer, widths)
    return DistributedEmbedding(features, seed=seed, env=env, plan=plan, dynamic_shards=num_shards, name="embedding")
