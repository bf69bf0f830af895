"""The models of tf_dlrm, all on one sharded embedding, picked by ``--model``.

- :class:`DLRM` (default): bottom MLP, dot / cat interaction, top MLP;
- :class:`DCNv2`: cross network + deep MLP, stacked or parallel;
- :class:`DeepFM`: first-order weights + FM second-order term + deep MLP;
- :class:`WideDeep`: wide linear part over ids and crossed ids + deep MLP.

:func:`build_family_model` makes DCNv2, DeepFM or Wide & Deep from a feature spec and a plan whose
tables come from :func:`tf_dlrm.models.tables.family_tables`.
"""

from __future__ import annotations

from tf_dlrm.config.model_tables import family_features
from tf_dlrm.config.models import ModelFamilyConfig, ModelName
from tf_dlrm.embedding import DistributedEmbedding
from tf_dlrm.models.dcnv2 import DCNv2
from tf_dlrm.models.deepfm import DeepFM
from tf_dlrm.models.dlrm import DLRM
from tf_dlrm.models.expanded_embedding import ExpandedEmbedding
from tf_dlrm.models.wide_deep import WideDeep

__all__ = ["DCNv2", "DLRM", "DeepFM", "ExpandedEmbedding", "WideDeep", "build_family_model"]


def build_family_model(family: ModelFamilyConfig, base_features, crossed, plan, num_numerical: int, rank: int, seed: int,
                       data_parallel_input: bool = False, init_bound: float | None = None):
    """An unbuilt DCNv2 / DeepFM / Wide & Deep whose embedding executes ``plan`` on ``rank``.

    Args:
        family: the model and its hyper-parameters (not ``dlrm``).
        base_features: one :class:`FeatureConfig` per categorical column, in spec order.
        crossed: the spec's crossed features (Wide & Deep).
        plan: the sharding plan of :func:`family_tables`' tables.
        num_numerical: numerical features per sample.
        rank: this process's rank.
        seed: initial tables depend on ``(seed, table)``; dense weights on ``seed``.
        data_parallel_input: DCNv2 only (the others always read local batches and exchange ids).
        init_bound: the embedding's initial bound (:class:`DistributedEmbedding`; None: ``1/sqrt(rows)``).
    """
    features, sources = family_features(base_features, family, crossed)
    if family.uses_expanded_features:
        embedding = ExpandedEmbedding.from_plan(plan, rank=rank, seed=seed, features=features, sources=sources,
                                      init_bound=init_bound, name="embedding")
    else:
        embedding = DistributedEmbedding.from_plan(plan, rank=rank, seed=seed, data_parallel_input=data_parallel_input,
                                         features=features, init_bound=init_bound, name="embedding")
    common = dict(num_numerical=num_numerical, num_deep_features=len(base_features), seed=seed, name=family.model)
    if family.model == ModelName.DCNV2.value:
        return DCNv2(embedding, num_cross_layers=family.num_cross_layers, cross_low_rank=family.cross_low_rank,
                     cross_structure=family.cross_structure, deep_mlp_dims=family.deep_mlp_dims, **common)
    if family.model == ModelName.DEEPFM.value:
        return DeepFM(embedding, deep_mlp_dims=family.deep_mlp_dims, **common)
    if family.model == ModelName.WIDE_DEEP.value:
        return WideDeep(embedding, deep_mlp_dims=family.deep_mlp_dims, wide_optimizer=family.wide_optimizer,
                        wide_learning_rate=family.wide_learning_rate, **common)
    raise ValueError(f"build_family_model makes dcnv2, deepfm and wide_deep. Received: model={family.model!r}")
