"""A served SavedModel refuses a wrong batch with its own message (tf_dlrm/embedding/serving.py).

A signature checks dtypes only: a ``[batch, 4]`` tensor binds to a ``[None, 3]`` input, and a model
that slices its columns would drop the extra one and score. The served function asserts widths, one
batch size across inputs, and that a ragged input's row lengths sum to its values, inside the graph.
Inputs serve under :func:`~tf_dlrm.embedding.serving.input_name` (``dense.x`` as ``dense_x``), and the
output is the sigmoid of the model's logits.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_dlrm.embedding.serving import export_saved_model, serving_module

SIGNATURE = {"item": tf.TensorSpec([None], tf.int64), "history": tf.RaggedTensorSpec([None, None], tf.int64, 1),
             "dense.x": tf.TensorSpec([None, 3], tf.float32)}


class SliceModel(keras.Model):
    """Reads only the columns it knows, as a DLRM does: it would score a batch with an extra column."""

    def call(self, inputs, training=False):
        history = tf.cast(tf.reduce_sum(inputs["history"], axis=1), tf.float32)
        dense = inputs["dense.x"][:, 0] + inputs["dense.x"][:, 1] + inputs["dense.x"][:, 2]
        # Logits [b, 1], as every model returns them; scaled down so that the served sigmoids differ.
        return tf.reshape(tf.cast(inputs["item"], tf.float32) + history + dense, [-1, 1]) / 4


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model = SliceModel(name="slice_model")
    path = str(tmp_path_factory.mktemp("serving") / "model")
    export_saved_model(model, path, SIGNATURE)
    return tf.saved_model.load(path).signatures["serving_default"]


def _batch(rows: int = 4, dense_width: int = 3):
    return {"item": tf.range(rows, dtype=tf.int64), "history_values": tf.ones([2 * rows], tf.int64),
            "history_row_lengths": tf.fill([rows], tf.constant(2, tf.int64)),
            "dense_x": tf.ones([rows, dense_width], tf.float32)}


def _refusal(served, batch) -> str:
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        served(**batch)
    lines = [line for line in str(caught.value).splitlines() if "assertion failed" in line]
    assert lines, str(caught.value)
    return lines[0].replace("\\'", "'")  # TensorFlow escapes the quotes of the message


def test_a_right_batch_scores(served):
    probability = served(**_batch())["probability"].numpy()
    assert probability.shape == (4,) and probability.dtype == np.float32
    np.testing.assert_allclose(probability, 1 / (1 + np.exp(-np.array([5, 6, 7, 8]) / 4)), rtol=0, atol=1e-6)


def test_the_signature_takes_one_input_per_model_input(served):
    assert sorted(served.structured_input_signature[1]) == ["dense_x", "history_row_lengths", "history_values", "item"]


def test_a_wider_dense_input_is_refused(served):
    message = _refusal(served, _batch(dense_width=4))
    assert ("serving input 'dense_x': expected shape [batch, 3] (float32 values of 'dense.x'). Received shape:] [4 4]"
            in message)


def test_two_inputs_of_one_serving_name_are_refused():
    with pytest.raises(ValueError, match="inputs 'dense.x' and 'dense_x' both serve as 'dense_x'"):
        serving_module(SliceModel(), {**SIGNATURE, "dense_x": tf.TensorSpec([None, 3], tf.float32)})


def test_an_existing_path_is_refused(tmp_path):
    with pytest.raises(ValueError, match="Expected a new SavedModel path"):
        export_saved_model(SliceModel(), str(tmp_path), SIGNATURE)


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
