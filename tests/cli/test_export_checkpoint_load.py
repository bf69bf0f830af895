"""What ``--mode=export`` loads into a library model (tf_dlrm/cli/export.py ``load_checkpoint_into``), in one process.

Keras numbers a library model's unnamed layers per process (``dense``, ``dense_1``, then ``dense_2`` for a
second model), so the checkpoint's dense weights are matched by order when their names differ, each shape
checked: the model rebuilt under other names gets the saved tables and weights bit for bit, a model of
another shape is refused naming the file and both shapes (before any weight changes), and matching by name (tf_dlrm's own models) refuses
the other names, listing both.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_dlrm.checkpoint import model_checkpoint
from tf_dlrm.checkpoint import store as checkpoint_store
from tf_dlrm.cli.export import load_checkpoint_into
from tf_dlrm.embedding import DistributedEmbedding, FeatureConfig, Model, TableConfig


class Tiny(Model):
    """One table, two unnamed Dense layers: the names Keras gives them depend on what the process built before."""

    def __init__(self, hidden: int = 3):
        super().__init__()
        self.embedding = DistributedEmbedding([FeatureConfig("item", TableConfig("items", 10, 4))], seed=1,
                                              name="embedding")
        self.mlp = keras.Sequential([keras.layers.Dense(hidden, activation="relu"), keras.layers.Dense(1)], name="mlp")

    def call(self, inputs):
        pooled = self.embedding({"item": inputs["item"]})["item"]
        return self.mlp(tf.concat([pooled, inputs["numerical"]], axis=1))


def batch(rows: int = 16) -> dict:
    rng = np.random.default_rng(4)
    return {"item": tf.constant(rng.integers(0, 10, rows), tf.int64),
            "numerical": tf.constant(rng.normal(size=(rows, 2)).astype(np.float32))}


def dense_names(model) -> list[str]:
    return [v.path.split("/", 1)[1] for v in model.mlp.trainable_variables]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """``(trained model, checkpoint directory, its manifest)``: a few steps of ``fit``, saved as main.py saves."""
    keras.utils.set_random_seed(2)
    model = Tiny()
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    labels = tf.constant(np.random.default_rng(5).integers(0, 2, (16, 1)).astype(np.float32))
    model.fit(tf.data.Dataset.from_tensors((batch(), labels)).repeat(4), epochs=1, verbose=0)
    directory = model_checkpoint.save(model, str(tmp_path_factory.mktemp("tiny") / "ckpt"))
    return model, directory, checkpoint_store.read_manifest(directory)


def test_other_names_load_by_order(saved):
    model, directory, manifest = saved
    other = Tiny()
    other(batch())
    assert dense_names(other) != [entry["name"] for entry in manifest["dense"]]  # the case this test is about
    load_checkpoint_into(other, directory, manifest, by_name=False)
    np.testing.assert_array_equal(other.embedding.get_full_table(0), model.embedding.get_full_table(0))
    for mine, theirs in zip(other.mlp.trainable_variables, model.mlp.trainable_variables):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    np.testing.assert_array_equal(other(batch(), training=False).numpy(), model(batch(), training=False).numpy())


def test_other_names_are_refused_by_name(saved):
    _, directory, manifest = saved
    other = Tiny()
    other(batch())
    with pytest.raises(checkpoint_store.CheckpointError, match=r"dense weights \[.*\], the model has \[.*dense_\d"):
        load_checkpoint_into(other, directory, manifest, by_name=True)


def test_a_dense_weight_of_another_shape_is_refused(saved):
    _, directory, manifest = saved
    wider = Tiny(hidden=5)
    wider(batch())
    table = wider.embedding.get_full_table(0)
    with pytest.raises(checkpoint_store.CheckpointError, match=r"holds float32 \(6, 3\); expected float32 \(6, 5\)"):
        load_checkpoint_into(wider, directory, manifest, by_name=False)
    np.testing.assert_array_equal(wider.embedding.get_full_table(0), table)  # refused before anything changed
