"""Builds a registered model from tables and features (no FeatureSpec), as main.py's builder does.

For tests of DCNv2, DeepFM and Wide & Deep on hand-made tables: the model's own tables and features
come from the model class (:meth:`RankingModel.tables`, :meth:`RankingModel.features`), and the
embedding is an :class:`ExpandedEmbedding` when the model derives features from the columns.
"""

from __future__ import annotations


def build_family_model(name: str, params: dict, base_tables, base_features, crossed, plan_of, num_numerical: int,
                       rank: int, seed: int, data_parallel_input: bool = False):
    """``(plan, unbuilt model)``: ``plan_of(tables)`` makes the plan of the model's tables."""
    from tf_dlrm.embedding.distributed_embedding import DistributedEmbedding
    from tf_dlrm.models import registry
    from tf_dlrm.models.expanded_embedding import ExpandedEmbedding
    from tf_dlrm.models.ranking_model import column_sources

    cls = registry.lookup(name)
    config = cls.make_config(params)
    plan = plan_of(cls.tables(config, base_tables, crossed))
    features, sources = cls.features(config, base_features, crossed)
    if tuple(sources) != column_sources(len(base_features)):
        embedding = ExpandedEmbedding.from_plan(plan, rank=rank, seed=seed, features=features, sources=sources, name="embedding")
    else:
        embedding = DistributedEmbedding.from_plan(plan, rank=rank, seed=seed, data_parallel_input=data_parallel_input,
                                         features=features, name="embedding")
    return plan, cls(embedding, num_numerical, num_categorical=len(base_features), seed=seed, config=config)
