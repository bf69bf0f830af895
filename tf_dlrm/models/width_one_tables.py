"""Width-1 tables read with the ids of the spec's categorical columns: DeepFM's first-order weights
and Wide & Deep's wide part. Pure Python, no TensorFlow.

- ``linear:<feature>`` (``rows`` = the feature's cardinality): one weight per id, read with the
  feature's own ids, hotness and combiner;
- one table per crossed feature of the spec (``buckets`` rows), read with the crossed ids of its two
  features (:mod:`tf_dlrm.spec.crossed_features`, hashed by :mod:`tf_dlrm.models.layers.crossed_ids`).

A feature's *source* says where its ids come from: ``("column", i)`` reads column ``i``;
``("cross", i, j)`` hashes columns ``i`` and ``j`` (:meth:`tf_dlrm.models.ranking_model.RankingModel.embedding_inputs`).
"""

from __future__ import annotations

from collections.abc import Sequence

from tf_dlrm.spec.crossed_features import CrossedFeature
from tf_dlrm.embedding.table_config import FeatureConfig, TableConfig

LINEAR_PREFIX = "linear:"
# first * card2 + second must fit in int64 (tf_dlrm.models.layers.crossed_ids).
_PAIR_LIMIT = 2**62


def linear_tables(deep: Sequence[TableConfig]) -> list[TableConfig]:
    """One width-1 table per deep table, as many rows."""
    return [TableConfig(f"{LINEAR_PREFIX}{t.name}", t.vocabulary_size, 1) for t in deep]


def linear_features(deep: Sequence[FeatureConfig]) -> tuple[list[FeatureConfig], list[tuple]]:
    """One width-1 feature per deep feature, read with its column's ids."""
    features = [FeatureConfig(name=f"{LINEAR_PREFIX}{f.name}", table=f"{LINEAR_PREFIX}{f.table_name}", hotness=f.hotness,
                              combiner=f.combiner, ragged=f.ragged, weighted=f.weighted) for f in deep]
    return features, [("column", index) for index in range(len(deep))]


def with_linear_tables(deep: Sequence[TableConfig]) -> list[TableConfig]:
    """The deep tables, then one width-1 table of each (a factorization machine's first-order weights)."""
    return check_unique_names(list(deep) + linear_tables(deep))


def with_linear_features(deep: Sequence[FeatureConfig]) -> tuple[tuple[FeatureConfig, ...], tuple[tuple, ...]]:
    """``(features, sources)``: the deep features reading their columns, then one width-1 feature of each."""
    linear, sources = linear_features(deep)
    return tuple(deep) + tuple(linear), tuple(("column", i) for i in range(len(deep))) + tuple(sources)


class FirstOrderTables:
    """Mixin of a ranking model whose deep tables are followed by one width-1 table of each, read with the same ids
    (a factorization machine's first-order weights: FM's and DeepFM's ``tables`` and ``features``)."""

    @classmethod
    def tables(cls, config, deep, crossed=()):
        return with_linear_tables(deep)

    @classmethod
    def features(cls, config, deep, crossed=()):
        return with_linear_features(deep)


def crossed_tables(deep: Sequence[TableConfig], crossed: Sequence[CrossedFeature]) -> list[TableConfig]:
    """One width-1 table per crossed feature (``buckets`` rows)."""
    rows = {t.name: t.vocabulary_size for t in deep}
    for feature in crossed:
        if rows[feature.first] * rows[feature.second] >= _PAIR_LIMIT:
            raise ValueError(f"crossed feature {feature.name}: cardinalities {rows[feature.first]} x {rows[feature.second]} "
                             f"exceed 2^62 pairs; cross smaller features")
    return [TableConfig(f.name, f.buckets, 1) for f in crossed]


def crossed_features(deep: Sequence[FeatureConfig], crossed: Sequence[CrossedFeature]) -> tuple[list[FeatureConfig], list[tuple]]:
    """One width-1 feature per crossed feature, read with the crossed ids of its two columns."""
    columns = {f.name: i for i, f in enumerate(deep)}
    return ([FeatureConfig(name=c.name, table=c.name) for c in crossed],
            [("cross", columns[c.first], columns[c.second]) for c in crossed])


def check_unique_names(tables: Sequence[TableConfig]) -> list[TableConfig]:
    """``tables``, refused when two share a name (a spec feature named like a derived table)."""
    names = [t.name for t in tables]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise ValueError(f"Table names used twice (a feature named like a derived table?): {clash}")
    return list(tables)
