"""ExpandedEmbedding: the sharded embedding of models that read extra tables from the same ids.

DeepFM and Wide & Deep read, besides one deep table per categorical column, width-1 tables whose
ids are derived from the columns (the column itself, or two columns crossed): see
:mod:`tf_dlrm.models.width_one_tables`. Every rank reads the **local** batch of every column (as with
``--data_parallel_input``), derives the ids of every feature locally, and the ids travel to the
ranks owning their tables with the id alltoall; so a derived feature may live on a rank that holds
neither of its source columns' tables.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from tf_dlrm.embedding.distributed_embedding import DistributedEmbedding
from tf_dlrm.models.layers.crossed_ids import crossed_ids


@keras.saving.register_keras_serializable(package="tf_dlrm")
class ExpandedEmbedding(DistributedEmbedding):
    """A :class:`DistributedEmbedding` whose inputs are the spec's categorical columns.

    Args:
        feature_configs and the keyword options: as :class:`DistributedEmbedding` (made with
            :meth:`DistributedEmbedding.from_plan`).
        sources: per feature, ``("column", i)`` or ``("cross", i, j)`` (indices of the columns).
    """

    def __init__(self, feature_configs, *, sources=(), **kwargs):
        # Always local batches of every column: derived ids are made where the columns are.
        kwargs["data_parallel_input"] = True
        super().__init__(feature_configs, **kwargs)
        self.sources = tuple(tuple(s) for s in sources)
        if len(self.sources) != self.num_features:
            raise ValueError(f"Expected one source per feature ({self.num_features}). Received: {len(self.sources)} sources")
        for feature, source in zip(self.features, self.sources):
            kind, columns = (source[0], source[1:]) if source else (None, ())
            if kind not in ("column", "cross") or len(columns) != (2 if kind == "cross" else 1) or \
                    any(not isinstance(c, int) or c < 0 for c in columns):
                raise ValueError(f"Expected source ('column', i) or ('cross', i, j) for feature {feature.name!r}. Received: {source}")
        self.num_columns = 1 + max(max(s[1:]) for s in self.sources)
        # The reader yields the local batch of each column, in order; derived ids are made here.
        self.global_categorical, self.local_categorical = (), tuple(range(self.num_columns))

    def call(self, categorical, local_batch=None):
        columns = list(categorical)
        ids = []
        for feature, source in enumerate(self.sources):
            if source[0] == "column":
                ids.append(columns[source[1]])
            else:
                first, second = source[1], source[2]
                buckets = self.cardinalities[self.feature_tables[feature]]
                # Column j is read by deep feature j, so its cardinality is that feature's table's rows.
                crossed = crossed_ids(columns[first], columns[second], self.cardinalities[self.feature_tables[second]], buckets)
                # In the dtype the reader gives ids (int32 for tables below 2^31 rows): the id
                # exchange stacks the features' ids together.
                ids.append(tf.cast(crossed, tf.convert_to_tensor(columns[first]).dtype))
        return super().call(ids, local_batch=local_batch)

    def _input_features(self) -> list[int]:
        # call() hands the base class the local ids of every feature, derived ones included.
        return list(range(self.num_features))

    def get_config(self):
        config = super().get_config()
        config.pop("data_parallel_input", None)
        return {**config, "sources": [list(s) for s in self.sources]}
