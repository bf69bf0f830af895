"""EmbeddingBank: the plain single-process reference that the distributed layer is tested against.

It has the interface of :class:`tf_dlrm.embedding.DistributedEmbedding` that models use:

- ``input_modes``: every feature's ids for the local batch (one process holds every table);
- ``call({feature name: ids}, weights) -> {feature name: [b, width]}`` (a sequence feature ``[b, hotness, width]``,
  weighted features' weights in ``weights``), or with ``stacked=True`` one tensor in feature order: ``[b, F, D]``,
  or ``[b, sum of widths]`` when the widths differ (compute dtype; a sequence feature counts as ``hotness``
  features);
- ``sparse_variables`` (every table) and ``dense_variables`` (none), each variable also marked with its kind
  (:mod:`tf_dlrm.embedding.variable_kind`), which is what the trainer reads;
- ``get_full_table(t)`` / ``set_full_table(t, values)``: one full table as numpy; with ``state_of`` and
  ``row_wise`` the same for an optimizer state variable of the table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import keras
import numpy as np
import tensorflow as tf

from tf_dlrm.embedding.table_config import FrequencyRegularizer, as_feature_config, default_features, feature_tables
from tf_dlrm.embedding.table_init import check_init_bound, initial_table_slice
from tf_dlrm.embedding.variable_kind import SliceLayout, VariableKind, mark, set_layout


def validate_tables(cardinalities: Sequence[int], embedding_dim) -> tuple[int, ...]:
    cardinalities = tuple(int(c) for c in cardinalities)
    if not cardinalities or any(c <= 0 for c in cardinalities):
        raise ValueError(f"Expected positive table cardinalities. Received: cardinalities={list(cardinalities)}")
    widths = [embedding_dim] if isinstance(embedding_dim, (int, np.integer)) else list(embedding_dim)
    if any(int(w) <= 0 for w in widths):
        raise ValueError(f"Expected a positive embedding dim. Received: embedding_dim={embedding_dim}")
    return cardinalities


@keras.saving.register_keras_serializable(package="tf_dlrm")
class EmbeddingBank(keras.layers.Layer):
    """One ``[rows, D_t]`` variable per table, one plain gather and reduction per feature: the
    single-process reference the distributed layer is tested against (written independently of
    its fused, pooled lookups on purpose).

    Args:
        cardinalities: rows of each table, in feature-spec order.
        embedding_dim: ``D`` of every table, or one width per table.
        seed: initial values come from ``(seed, table)`` (see :mod:`tf_dlrm.embedding.table_init`).
        features: :class:`tf_dlrm.embedding.FeatureConfig` (or dicts) naming tables
            ``t0, t1, ...`` or the names in ``table_names``; default one one-hot feature per table.
        table_names: the tables' names (default ``t<i>``).
        init_bound: initial values uniform in ``[-init_bound, init_bound]``; None: ``1/sqrt(rows)``.
        frequency_regularizer: None, or the :class:`tf_dlrm.embedding.FrequencyRegularizer` of every table.
    """

    def __init__(self, cardinalities: Sequence[int], embedding_dim, seed: int = 0, features=None,
                 table_names: Sequence[str] | None = None, init_bound: float | None = None, frequency_regularizer=None,
                 **kwargs):
        super().__init__(**kwargs)
        self.cardinalities = validate_tables(cardinalities, embedding_dim)
        count = len(self.cardinalities)
        widths = [embedding_dim] * count if isinstance(embedding_dim, (int, np.integer)) else list(embedding_dim)
        self.table_widths = tuple(int(w) for w in widths)
        self.table_names = tuple(table_names or [f"t{i}" for i in range(count)])
        self.features = tuple(as_feature_config(f) for f in (features or default_features(self.table_names)))
        self.feature_tables = feature_tables(self.features, self.table_names)
        self.feature_widths = tuple(self.table_widths[t] for t in self.feature_tables)
        widths = set(self.feature_widths)
        self.embedding_dim = widths.pop() if len(widths) == 1 else None
        self.seed = int(seed)
        self.init_bound = check_init_bound(init_bound)
        if isinstance(frequency_regularizer, dict):
            frequency_regularizer = FrequencyRegularizer(**frequency_regularizer)
        self.frequency_regularizer = frequency_regularizer
        self.tables = []

    @property
    def output_features(self) -> tuple:
        """Every feature, in the order of the output (as :attr:`DistributedEmbedding.output_features`)."""
        return self.features

    @property
    def output_widths(self) -> tuple:
        """The width of each feature (of each position of a sequence feature), in feature order (as
        :attr:`DistributedEmbedding.output_widths`)."""
        return tuple(w for f, w in zip(self.features, self.feature_widths) for _ in range(f.hotness if f.sequence else 1))

    @property
    def output_dim(self) -> int | None:
        """The one width of every feature, else None (as :attr:`DistributedEmbedding.output_dim`)."""
        return self.embedding_dim

    def frequency_regularizers(self) -> dict:
        """``{table index: FrequencyRegularizer or None}``, as :class:`DistributedEmbedding` reports them."""
        return {t: self.frequency_regularizer for t in range(len(self.cardinalities))}

    def build(self, input_shape=None):
        for index, (rows, width) in enumerate(zip(self.cardinalities, self.table_widths)):
            values = initial_table_slice(self.seed, index, rows, width, init_bound=self.init_bound)
            # Tables stay float32 under mixed precision: bf16/fp16 SGD updates of tiny gradients round away.
            table = self.add_weight(
                name=f"table_{index}", shape=values.shape, dtype="float32",
                initializer=lambda shape, dtype, v=values: tf.constant(v),
            )
            layout = SliceLayout([index], [(0, width)], [width])
            self.tables.append(set_layout(mark(table, VariableKind.SHARDED), layout))

    @property
    def sparse_variables(self) -> list:
        return list(self.tables)

    @property
    def dense_variables(self) -> list:
        return []

    def _pool(self, feature, ids, weights=None):
        table = self.tables[self.feature_tables[feature]]
        config = self.features[feature]
        if not isinstance(ids, tf.RaggedTensor) and ids.shape.rank == 1:
            if config.one_hot:
                return tf.gather(table, ids)
            ids = ids[:, None]
        if not isinstance(ids, tf.RaggedTensor):
            ids = tf.RaggedTensor.from_tensor(ids)
        vectors = tf.gather(table, ids)  # [n, None, w]
        if config.weighted:
            if not isinstance(weights, tf.RaggedTensor):
                weights = tf.convert_to_tensor(weights, tf.float32)
                weights = tf.RaggedTensor.from_tensor(weights if weights.shape.rank == 2 else weights[:, None])
            weights = tf.cast(weights, tf.float32)
            vectors = vectors * weights[:, :, None]
        if config.sequence:
            return vectors.to_tensor(shape=[None, config.hotness, table.shape[1]])
        total = tf.reduce_sum(vectors, axis=1)
        if config.weighted:
            count = tf.reduce_sum(weights, axis=1)[:, None]
            count = tf.sqrt(tf.reduce_sum(weights * weights, axis=1))[:, None] if config.combiner == "sqrtn" else count
            return total if config.combiner == "sum" else tf.math.divide_no_nan(total, count)
        count = tf.cast(ids.row_lengths(), tf.float32)[:, None]
        combiner = config.combiner
        if combiner == "mean":
            return tf.math.divide_no_nan(total, count)
        if combiner == "sqrtn":
            return tf.math.divide_no_nan(total, tf.sqrt(count))
        return total

    @property
    def input_modes(self) -> dict[str, str]:
        """Every feature's ids for the local batch (one process holds every table)."""
        return {feature.name: "local" for feature in self.features}

    def call(self, inputs, weights=None, local_batch=None, training=None, stacked=False):
        """``{feature name: ids}`` (and ``{feature name: weights}`` of the weighted ones) -> ``{feature name:
        [b, width]}``, or with ``stacked`` the :class:`DistributedEmbedding`'s stacked form (``[b, F, D]``, or
        ``[b, sum of widths]``)."""
        if not isinstance(inputs, Mapping):
            raise TypeError(f"Expected a dict of feature name -> ids. Received: {type(inputs).__name__}")
        weights = weights or {}
        vectors = [self._pool(f, inputs[feature.name], weights.get(feature.name)) for f, feature in enumerate(self.features)]
        if not stacked:
            return {feature.name: tf.cast(v, self.compute_dtype) for feature, v in zip(self.features, vectors)}
        # A sequence feature's positions count as features in the stacked form.
        vectors = [piece for v, feature in zip(vectors, self.features)
                   for piece in (tf.unstack(v, feature.hotness, axis=1) if feature.sequence else [v])]
        if self.embedding_dim is None:
            return tf.cast(tf.concat(vectors, axis=1), self.compute_dtype)
        return tf.cast(tf.stack(vectors, axis=1), self.compute_dtype)

    def compute_output_shape(self, input_shape):
        if self.embedding_dim is None:
            return (None, sum(self.output_widths))
        return (None, len(self.output_widths), self.embedding_dim)

    def get_full_table(self, table: int, state_of=None, row_wise: bool = False) -> np.ndarray:
        """``state_of`` maps a table variable to its optimizer state (see DistributedEmbedding)."""
        return (state_of or (lambda v: v))(self.tables[table]).numpy()

    def set_full_table(self, table: int, values: np.ndarray, state_of=None, row_wise: bool = False) -> None:
        (state_of or (lambda v: v))(self.tables[table]).assign(np.asarray(values, dtype=np.float32))

    def get_config(self):
        return {
            **super().get_config(),
            "cardinalities": list(self.cardinalities),
            "embedding_dim": list(self.table_widths),
            "seed": self.seed,
            "init_bound": self.init_bound,
            "features": [f.to_dict() for f in self.features],
            "table_names": list(self.table_names),
            "frequency_regularizer": None if self.frequency_regularizer is None
            else dataclasses.asdict(self.frequency_regularizer),
        }
