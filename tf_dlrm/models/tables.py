"""The tables and features each model reads: pure Python, no TensorFlow.

Every model reads one deep table per categorical feature (named like the feature, width
``--embedding_dim`` or the spec's / ``--embedding_dims``' width). DeepFM and Wide & Deep add
**width-1 tables**, sharded by the same plan as the others:

- ``linear:<feature>`` (``rows`` = the feature's cardinality): the first-order weight of each id
  (DeepFM) or the wide weight of each id (Wide & Deep), read with the feature's own ids, hotness and
  combiner;
- Wide & Deep only: one table per crossed feature of the spec (``buckets`` rows), read with the
  crossed ids of its two features (:mod:`tf_dlrm.spec.crossed_features`).

The model derives every extra feature's ids from the spec's categorical columns (a *source*):
``("column", i)`` reads column ``i``; ``("cross", i, j)`` hashes columns ``i`` and ``j``.
"""

from __future__ import annotations

from collections.abc import Sequence

from tf_dlrm.config.crossed_features import CrossedFeature
from tf_dlrm.embedding.table_config import FeatureConfig
from tf_dlrm.config.models import ModelFamilyConfig, ModelName
from tf_dlrm.distributed.plan import TableSpec

LINEAR_PREFIX = "linear:"
# first * card2 + second must fit in int64 (tf_dlrm.models.layers.crossed_ids).
_PAIR_LIMIT = 2**62


def family_tables(base: Sequence[TableSpec], family: ModelFamilyConfig, crossed: Sequence[CrossedFeature] = ()) -> list[TableSpec]:
    """The deep tables ``base`` (one per categorical feature), then the model's width-1 tables."""
    tables = list(base)
    if family.model in (ModelName.DEEPFM.value, ModelName.WIDE_DEEP.value):
        tables += [TableSpec(f"{LINEAR_PREFIX}{t.name}", t.rows, 1) for t in base]
    if family.model == ModelName.WIDE_DEEP.value:
        rows = {t.name: t.rows for t in base}
        for feature in crossed:
            if rows[feature.first] * rows[feature.second] >= _PAIR_LIMIT:
                raise ValueError(f"crossed feature {feature.name}: cardinalities {rows[feature.first]} x {rows[feature.second]} "
                                 f"exceed 2^62 pairs; cross smaller features")
        tables += [TableSpec(f.name, f.buckets, 1) for f in crossed]
    names = [t.name for t in tables]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise ValueError(f"Table names used twice (a feature named like a derived table?): {clash}")
    return tables


def family_features(base: Sequence[FeatureConfig], family: ModelFamilyConfig, crossed: Sequence[CrossedFeature] = ()
                    ) -> tuple[tuple[FeatureConfig, ...], tuple[tuple, ...]]:
    """``(features, sources)``: the deep features ``base`` (one per categorical column, in spec
    order), then the model's width-1 features; ``sources[f]`` says where feature ``f``'s ids come from."""
    features = list(base)
    sources: list[tuple] = [("column", index) for index in range(len(base))]
    if family.model in (ModelName.DEEPFM.value, ModelName.WIDE_DEEP.value):
        for index, feature in enumerate(base):
            features.append(FeatureConfig(name=f"{LINEAR_PREFIX}{feature.name}", table=f"{LINEAR_PREFIX}{feature.table_name}",
                                          hotness=feature.hotness, combiner=feature.combiner, ragged=feature.ragged))
            sources.append(("column", index))
    if family.model == ModelName.WIDE_DEEP.value:
        columns = {f.name: i for i, f in enumerate(base)}
        for cross in crossed:
            features.append(FeatureConfig(name=cross.name, table=cross.name))
            sources.append(("cross", columns[cross.first], columns[cross.second]))
    return tuple(features), tuple(sources)
