"""The models of tf_dlrm, one file each, all on one sharded embedding, picked by ``--model``.

Each subclasses :class:`tf_dlrm.models.ranking_model.RankingModel` and registers itself by name
(:mod:`tf_dlrm.models.registry`, which imports every module of this package): ``dlrm`` (bottom MLP,
dot / cat interaction, top MLP), ``dcnv2`` (cross network + deep MLP), ``deepfm`` (first order + FM +
deep MLP), ``wide_deep`` (wide linear part over ids and crossed ids + deep MLP). A user's model is
picked by import path instead: ``--model=package.module:Class``.
"""
