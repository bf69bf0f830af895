"""The layer that executes a given sharding plan, for tests that need one exact plan (a strategy, a column
slicing, a world size other than this process's): the plan's tables as :class:`TableConfig` objects, features
holding them, and the plan handed to :class:`DistributedEmbedding` with the rank it runs as.

Tables start uniform in ``[-1/sqrt(rows), 1/sqrt(rows)]`` (``uniform_sqrt_rows``), like the reference
:class:`EmbeddingBank`'s default, unless ``initializer`` says otherwise; by default every rank reads the global
batch of the features whose tables it owns (``data_parallel_input=False``), as ``main.py``'s loader does.
"""

from __future__ import annotations

import dataclasses

from tf_dlrm.embedding import DistributedEmbedding, FeatureConfig, Placement, TableConfig
from tf_dlrm.embedding.table_config import as_feature_config
from tf_dlrm.parallel.env import DistributedEnv


def plan_table_configs(plan, initializer="uniform_sqrt_rows", hot_rows=None, storage: str = "float32",
                       frequency_regularizer=None) -> dict[str, TableConfig]:
    """``{name: TableConfig}`` of ``plan``'s tables, in plan order; ``hot_rows``: ``{table index: ids}``;
    ``storage`` applies to the model-parallel tables; ``frequency_regularizer`` to every table."""
    model_parallel = set(plan.model_parallel)
    return {t.name: TableConfig(t.name, t.rows, t.dim, initializer=initializer,
                                placement=Placement(hot_rows=tuple((hot_rows or {}).get(index, ())),
                                                    storage=storage if index in model_parallel else "float32"),
                                frequency_regularizer=frequency_regularizer)
            for index, t in enumerate(plan.tables)}


def plan_layer(plan, rank: int = 0, features=None, *, initializer="uniform_sqrt_rows", hot_rows=None,
               storage: str = "float32", layer_class=DistributedEmbedding, frequency_regularizer=None,
               **options) -> DistributedEmbedding:
    """The :class:`DistributedEmbedding` (or ``layer_class``) of ``plan`` on ``rank``; ``features``:
    :class:`FeatureConfig` objects (or dicts) whose ``table`` is a plan table's name (default one one-hot ``sum`` feature per
    table, named like it)."""
    tables = plan_table_configs(plan, initializer, hot_rows, storage, frequency_regularizer)
    if features is None:
        features = [FeatureConfig(name, table) for name, table in tables.items()]
    else:
        features = [dataclasses.replace(f, table=tables[f.table]) for f in map(as_feature_config, features)]
    options.setdefault("data_parallel_input", False)
    return layer_class(features, plan=plan, env=DistributedEnv(rank=rank, world_size=plan.world_size),
                       **options)
