"""The embedding of dynamic tables from a feature spec (``main.py`` builds it through
:func:`tf_dlrm.cli.builder.make_embedding` when the spec has ``dynamic: true`` features): the same
:class:`DistributedEmbedding` as every other run, its tables placed as dynamic."""

from __future__ import annotations

from tf_dlrm.embedding.distributed_embedding import DistributedEmbedding
from tf_dlrm.embedding.table_config import DynamicStorage, FeatureConfig, Placement, TableConfig
from tf_dlrm.parallel.env import DistributedEnv
from tf_dlrm.spec import dynamic as dynamic_spec


def has_dynamic_tables(spec) -> bool:
    return bool(dynamic_spec.dynamic_features(spec))


def dynamic_table_configs(spec, initializer, widths) -> list[TableConfig]:
    """One dynamic :class:`TableConfig` per categorical feature, named after it; ``initializer``:
    ``--embedding_init``'s (``"uniform_sqrt_rows"``: new rows uniform in ``1/sqrt(capacity)``); ``widths``: each
    table's width. Every categorical feature must be dynamic and one-hot (the error names the others)."""
    names = spec.categorical_features
    fixed = [n for n in names if not dynamic_spec.is_dynamic(spec.feature_spec[n])]
    if fixed:
        raise ValueError(f"Expected every categorical feature to be dynamic, or none (mixed models are not supported "
                         f"yet). Received fixed features {fixed} beside dynamic ones")
    multi_hot = [n for n in names if spec.hotness(n) != 1]
    if multi_hot:
        raise ValueError(f"Expected one-hot dynamic features. Received: hotness > 1 for {multi_hot}")
    tables = []
    for name, width in zip(names, widths):
        properties = spec.feature_spec[name]
        storage = DynamicStorage(capacity=int(properties["capacity"]), eviction=properties.get("eviction", "none"),
                                 min_count=int(properties.get("min_count", 1)),
                                 capacity_scope=properties.get("capacity_scope", "per_rank"),
                                 max_idle_steps=properties.get("max_idle_steps"))
        tables.append(TableConfig(name, storage.capacity, int(width), initializer=initializer,
                                  placement=Placement(dynamic=storage)))
    return tables


def make_dynamic_embedding(spec, initializer, env: DistributedEnv, seed: int, widths, num_shards: int | None = None
                           ) -> DistributedEmbedding:
    """The (unbuilt) embedding of :func:`dynamic_table_configs`' tables, one feature each; ``num_shards``:
    shards of every table (default: the world size; export holds a checkpoint's shards in one process)."""
    features = [FeatureConfig(table.name, table) for table in dynamic_table_configs(spec, initializer, widths)]
    return DistributedEmbedding(features, seed=seed, env=env, dynamic_shards=num_shards, name="embedding")
