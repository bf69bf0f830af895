"""A served SavedModel refuses a wrong batch with its own message (tf_dlrm/embedding/serving.py).

A signature checks dtypes only: a ``[batch, 4]`` tensor binds to a ``[None, 3]`` input, and a model
that slices its columns would drop the extra one and score. The served function asserts widths, one
batch size across inputs, and that a ragged input's row lengths sum to its values, inside the graph.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_dlrm.embedding.serving import export_saved_model

SIGNATURE = {"item": tf.TensorSpec([None], tf.int64), "history": tf.RaggedTensorSpec([None, None], tf.int64, 1),
             "dense": tf.TensorSpec([None, 3], tf.float32)}


class SliceModel(keras.Model):
    """Reads only the columns it knows, as a DLRM does: it would score a batch with an extra column."""

    def call(self, inputs, training=False):
        history = tf.cast(tf.reduce_sum(inputs["history"], axis=1), tf.float32)
        dense = inputs["dense"][:, 0] + inputs["dense"][:, 1] + inputs["dense"][:, 2]
        return tf.cast(inputs["item"], tf.float32) + history + dense


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model = SliceModel(name="slice_model")
    path = str(tmp_path_factory.mktemp("serving") / "model")
    export_saved_model(model, path, SIGNATURE)
    return tf.saved_model.load(path).signatures["serving_default"]


def _batch(rows: int = 4, dense_width: int = 3):
    return {"item": tf.range(rows, dtype=tf.int64), "history_values": tf.ones([2 * rows], tf.int64),
            "history_row_lengths": tf.fill([rows], tf.constant(2, tf.int64)),
            "dense": tf.ones([rows, dense_width], tf.float32)}


def _refusal(served, batch) -> str:
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        served(**batch)
    lines = [line for line in str(caught.value).splitlines() if "assertion failed" in line]
    assert lines, str(caught.value)
    return lines[0].replace("\\'", "'")  # TensorFlow escapes the quotes of the message


def test_a_right_batch_scores(served):
    np.testing.assert_allclose(served(**_batch())["output"].numpy(), [5, 6, 7, 8])


def test_a_wider_dense_input_is_refused(served):
    message = _refusal(served, _batch(dense_width=4))
    assert "serving input 'dense': expected shape [batch, 3] (float32 values). Received shape:] [4 4]" in message


def test_inputs_of_different_batch_sizes_are_refused(served):
    batch = _batch()
    batch["item"] = tf.range(3, dtype=tf.int64)
    message = _refusal(served, batch)
    assert "serving inputs 'item' and 'history' must hold the same number of samples" in message
    assert "Received: 'item'] [3] [rows, 'history'] [4] [rows]" in message


def test_ragged_row_lengths_must_sum_to_the_values(served):
    batch = _batch()
    batch["history_row_lengths"] = tf.constant([2, 2, 2, 3], tf.int64)
    message = _refusal(served, batch)
    assert "serving inputs 'history_row_lengths' and 'history_values': the row lengths must sum to the number of values" \
        in message
