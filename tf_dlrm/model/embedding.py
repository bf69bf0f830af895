"""The embedding interface of DLRM and its plain single-process implementation.

Any embedding layer of tf_dlrm (this reference bank, or the sharded
:class:`tf_dlrm.distributed.embedding.DistributedEmbedding`) has:

- ``global_categorical`` / ``local_categorical``: which categorical features (indices into the
  feature spec's categorical channel) it wants for the global batch and for the local batch; the
  reader yields them in that order (global ones first);
- ``call(categorical) -> [local_batch, T, D]``: all T tables in feature-spec order, in the layer's
  compute dtype;
- ``sparse_variables`` (rank-local) and ``dense_variables`` (data-parallel), each variable also
  marked with its kind (:mod:`tf_dlrm.model.variable_kind`), which is what the trainer reads;
- ``get_full_table(t)`` / ``set_full_table(t, values)``: one full table as numpy (collective in the
  distributed layer; the root rank gets or gives the values); with ``state_of`` and ``row_wise``
  the same for an optimizer state variable of the table.
"""

from __future__ import annotations

from typing import Sequence

import keras
import numpy as np
import tensorflow as tf

from tf_dlrm.model.table_init import initial_table_slice
from tf_dlrm.model.variable_kind import SliceLayout, VariableKind, mark, set_layout


def validate_tables(cardinalities: Sequence[int], embedding_dim: int) -> tuple[int, ...]:
    cardinalities = tuple(int(c) for c in cardinalities)
    if not cardinalities or any(c <= 0 for c in cardinalities):
        raise ValueError(f"Expected positive table cardinalities. Received: cardinalities={list(cardinalities)}")
    if int(embedding_dim) <= 0:
        raise ValueError(f"Expected a positive embedding dim. Received: embedding_dim={embedding_dim}")
    return cardinalities


@keras.saving.register_keras_serializable(package="tf_dlrm")
class EmbeddingBank(keras.layers.Layer):
    """One ``[rows, D]`` variable per table, one gather per table: the single-process reference.

    Args:
        cardinalities: rows of each table, in feature-spec order.
        embedding_dim: ``D``.
        seed: initial values come from ``(seed, table)`` (see :mod:`tf_dlrm.model.table_init`).
    """

    def __init__(self, cardinalities: Sequence[int], embedding_dim: int, seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.cardinalities = validate_tables(cardinalities, embedding_dim)
        self.embedding_dim = int(embedding_dim)
        self.seed = int(seed)
        self.global_categorical: tuple[int, ...] = ()
        self.local_categorical = tuple(range(len(self.cardinalities)))
        self.tables = []

    def build(self, input_shape=None):
        for index, rows in enumerate(self.cardinalities):
            values = initial_table_slice(self.seed, index, rows, self.embedding_dim)
            # Tables stay float32 under mixed precision: bf16/fp16 SGD updates of tiny gradients round away.
            table = self.add_weight(
                name=f"table_{index}", shape=values.shape, dtype="float32",
                initializer=lambda shape, dtype, v=values: tf.constant(v),
            )
            layout = SliceLayout([index], [(0, self.embedding_dim)], [self.embedding_dim])
            self.tables.append(set_layout(mark(table, VariableKind.SHARDED), layout))

    @property
    def sparse_variables(self) -> list:
        return list(self.tables)

    @property
    def dense_variables(self) -> list:
        return []

    def call(self, categorical, local_batch=None):
        vectors = [tf.gather(table, ids) for table, ids in zip(self.tables, categorical)]
        return tf.cast(tf.stack(vectors, axis=1), self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return (input_shape[0][0], len(self.cardinalities), self.embedding_dim)

    def get_full_table(self, table: int, state_of=None, row_wise: bool = False) -> np.ndarray:
        """``state_of`` maps a table variable to its optimizer state (see DistributedEmbedding)."""
        return (state_of or (lambda v: v))(self.tables[table]).numpy()

    def set_full_table(self, table: int, values: np.ndarray, state_of=None, row_wise: bool = False) -> None:
        (state_of or (lambda v: v))(self.tables[table]).assign(np.asarray(values, dtype=np.float32))

    def get_config(self):
        return {
            **super().get_config(),
            "cardinalities": list(self.cardinalities),
            "embedding_dim": self.embedding_dim,
            "seed": self.seed,
        }
