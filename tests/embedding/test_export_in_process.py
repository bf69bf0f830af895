"""A library model trained in this process with tf_dlrm's kernels exports and serves, with no second process
and no TF_DLRM_DISABLE_KERNELS (tf_dlrm/embedding/serving.py traces the signature inside kernels_off).

The model of tests/embedding/interest_model.py (a ragged mean feature, a shared, a replicated and a dynamic
table) trains a few steps with ``fit``; its forward pass, traced here, runs tf_dlrm's own ops (checked, so
that the test cannot pass on a machine where no kernel was used). The SavedModel written from this very
process is served by a process that never imports tf_dlrm and scores what the model scores (1e-6: the same
float32 graph on the same weights; only TensorFlow's choice of ops differs from the kernels').
"""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.embedding.interest_model import (
    NUM_DENSE, SEED, InterestModel, make_data, make_embedding, probe_batch, serve_without_tf_dlrm, write_probe,
)
from tf_dlrm.embedding.serving import export_saved_model, own_kernels
from tf_dlrm.ops import kernels

SIGNATURE = {"numerical": tf.TensorSpec([None, NUM_DENSE], tf.float32), "item": tf.TensorSpec([None], tf.int64),
             "history": tf.RaggedTensorSpec([None, None], tf.int64, 1), "user": tf.TensorSpec([None], tf.int64),
             "category": tf.TensorSpec([None], tf.int64), "device": tf.TensorSpec([None], tf.int64),
             "query": tf.TensorSpec([None], tf.int64)}


def test_a_model_trained_here_with_the_kernels_exports_and_serves(tmp_path):
    if kernels() is None:
        pytest.skip("tf_dlrm's kernel library is not loaded here (TF_DLRM_DISABLE_KERNELS or not built)")
    keras.utils.set_random_seed(SEED)
    model = InterestModel(make_embedding(SEED, "auto"))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    data = make_data(8 * 48, SEED)
    features = {name: data[name] for name in ("item", "user", "category", "device", "query", "numerical")}
    features["history"] = tf.RaggedTensor.from_row_lengths(data["history_values"], data["history_lengths"])
    model.fit(tf.data.Dataset.from_tensor_slices((features, data["label"])).batch(48), epochs=1, verbose=0)

    forward = tf.function(lambda inputs: model(inputs, training=False), input_signature=[SIGNATURE])
    assert own_kernels(forward), "the model trained here ran none of tf_dlrm's kernels: nothing to prove"

    exported = str(tmp_path / "serving")
    export_saved_model(model, exported, SIGNATURE)
    probe = probe_batch(SEED)
    expected = tf.reshape(tf.sigmoid(model(probe, training=False)), [-1]).numpy()
    write_probe(str(tmp_path / "probe.npz"), SEED)
    served = serve_without_tf_dlrm(exported, str(tmp_path / "probe.npz"), str(tmp_path / "served.npy"))
    assert served.shape == expected.shape == (40,)
    assert expected.std() > 1e-4, expected  # the probe's rows score differently: a mixed-up input would show
    np.testing.assert_allclose(served, expected, rtol=0, atol=1e-6)
    assert os.path.isfile(os.path.join(exported, "saved_model.pb")) and not os.path.exists(f"{exported}.tmp")
