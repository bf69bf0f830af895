"""Sequence features (no combiner) as one-id features by position, so they travel the pooled exchange.

A sequence feature ``f`` of hotness ``H`` returns ``[batch, H, dim]``: position ``i`` of a sample holds
the vector of its ``i``-th id (times its weight, if weighted), zeros where the sample has fewer ids.
That is exactly what ``H`` ragged features ``f[0] .. f[H-1]`` of at most one id each, pooled by ``sum``,
return side by side: an empty row pools to zeros and sends no gradient to any row. So the layer plans,
looks up, exchanges and differentiates the positions as ordinary features (every placement, the id
exchange and the kernel work unchanged; a position costs the exchange bytes of a one-hot feature), and
stacks them back into ``[batch, H, dim]`` at the end. The padded form was chosen over a ragged output
because the exchange moves rectangular blocks: a ragged output would need a second alltoall of sizes
known only when run, and attention over a history masks padded positions anyway.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tf_dlrm.embedding.table_config import FeatureConfig


def position_name(feature: str, position: int) -> str:
    return f"{feature}[{position}]"


def expand_sequences(features: Sequence[FeatureConfig]) -> tuple[tuple[FeatureConfig, ...], tuple[tuple[int, ...], ...]]:
    """``(internal features, positions)``: every sequence feature replaced by its positions (ragged, hotness 1,
    ``sum``, weighted as it is); ``positions[j]`` lists the internal indices of the user's feature ``j``."""
    internal, positions = [], []
    for feature in features:
        if not feature.sequence:
            positions.append((len(internal),))
            internal.append(feature)
            continue
        first = len(internal)
        internal.extend(FeatureConfig(position_name(feature.name, i), feature.table, hotness=1, ragged=True,
                                      combiner="sum", weighted=feature.weighted) for i in range(feature.hotness))
        positions.append(tuple(range(first, len(internal))))
    return tuple(internal), tuple(positions)


def split_positions(ids: tf.RaggedTensor, weights, hotness: int) -> list[tuple]:
    """``[(ids at position i, their weights or None)]`` for ``i < hotness``: ragged rows of zero or one id
    (``weights``: float32 values aligned with ``ids.values``, or None)."""
    lengths = ids.row_lengths()
    dense = ids.to_tensor(shape=[None, hotness])
    dense_weights = None if weights is None else ids.with_values(weights).to_tensor(shape=[None, hotness])
    result = []
    for i in range(hotness):
        present = lengths > i
        values = tf.boolean_mask(dense[:, i], present)
        at = tf.RaggedTensor.from_row_lengths(values, tf.cast(present, lengths.dtype), validate=False)
        result.append((at, None if dense_weights is None else tf.boolean_mask(dense_weights[:, i], present)))
    return result
