"""Builds a registered model from tables and features (no FeatureSpec), as main.py's builder does.

For tests of DCNv2, DeepFM and Wide & Deep on hand-made tables: the model's own tables and features
come from the model class (:meth:`RankingModel.tables`, :meth:`RankingModel.features`), and the
embedding reads the local batch of every column when the model derives features from them.
"""

from __future__ import annotations


def build_family_model(name: str, params: dict, base_tables, base_features, crossed, plan_of, num_numerical: int,
                       rank: int, seed: int, data_parallel_input: bool = False, optimizer=None):
    """``(plan, unbuilt model)``: ``base_tables`` are :class:`TableConfig` objects (one per column);
    ``plan_of(tables)`` makes the plan of the model's tables (the planner's ``TableSpec``s); ``optimizer`` (an
    OptimizerConfig) gives the model's own per-table optimizers the run's hyper-parameters."""
    import dataclasses

    from tf_dlrm.embedding.distributed_embedding import DistributedEmbedding
    from tf_dlrm.embedding.planning import table_specs
    from tf_dlrm.models import registry
    from tf_dlrm.models.ranking_model import column_sources
    from tf_dlrm.parallel.env import DistributedEnv
    from tf_dlrm.embedding import optimizers as table_optimizers

    cls = registry.lookup(name)
    config = cls.make_config(params)
    tables = cls.tables(config, base_tables, crossed)
    plan = plan_of(table_specs(tables))
    chosen = cls.table_optimizers(config, tables, len(base_tables))
    if optimizer is not None:
        chosen = {t: table_optimizers.from_settings(optimizer, o.name, o.learning_rate) for t, o in chosen.items()}
    configs = {t.name: dataclasses.replace(t, optimizer=chosen.get(i)) for i, t in enumerate(tables)}
    features, sources = cls.features(config, base_features, crossed)
    features = [dataclasses.replace(f, table=configs[f.table_name]) for f in features]
    env = DistributedEnv(rank=rank, world_size=plan.world_size)
    derived = tuple(sources) != column_sources(len(base_features))
    embedding = DistributedEmbedding(features, plan=plan, env=env, seed=seed,
                                     data_parallel_input=data_parallel_input or derived, name="embedding")
    return plan, cls(embedding, num_numerical, num_categorical=len(base_features), seed=seed, config=config,
                     sources=sources)
