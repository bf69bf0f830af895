"""--mode=export of a multi-hot model: a DCNv2 on NVIDIA's split_tfrecords layout with a one-hot, a ragged
(1 to 3 ids per sample) and a fixed-hotness (2 ids) feature, served by plain TensorFlow in a process that
never imports tf_dlrm, predicts what the training model predicts; wrong multi-hot input is refused."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from conftest import run_python

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data"))
from test_split_tfrecords import write_dataset  # noqa: E402

FLAGS = ["--dataset_type=split_tfrecords", "--model=dcnv2", "--embedding_dim=8", "--deep_mlp_dims=16",
         "--num_cross_layers=2", "--cross_low_rank=4", "--batch_size=64", "--valid_batch_size=128", "--epochs=1", "--learning_rate=0.5",
         "--optimizer=sgd", "--embedding_optimizer=sgd", "--print_freq=1000", "--evals_per_epoch=0", "--seed=3"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """One process trains 10 steps, predicts the first validation batch from the checkpoint and exports it."""
    data, out = tmp_path_factory.mktemp("multi_hot_data"), tmp_path_factory.mktemp("multi_hot_export")
    write_dataset(str(data), num_prebatches=20, variable=True, fixed=(2,))
    flags = [f"--dataset_path={data}", *FLAGS]
    checkpoints, saved_model = os.path.join(out, "checkpoints"), os.path.join(out, "saved_model")
    restore = [f"--restore_checkpoint_path={checkpoints}"]
    tasks = [
        {"name": "train", "action": "train", "argv": flags + [f"--save_checkpoint_path={checkpoints}"]},
        {"name": "predict", "action": "predict", "argv": flags + restore},
        {"name": "export", "action": "mode", "argv": flags + restore + ["--mode=export", f"--saved_model_path={saved_model}"]},
    ]
    with open(os.path.join(out, "tasks.json"), "w") as handle:
        json.dump(tasks, handle)
    run_python(["tests/checkpoint/checkpoint_worker.py", os.path.join(out, "tasks.json"), str(out)])
    served, report = os.path.join(out, "served.npy"), os.path.join(out, "bad.json")
    # A fresh interpreter that never imports tf_dlrm (the script checks) loads it with tf.saved_model.load.
    run_python(["tests/cli/serve_saved_model.py", saved_model, os.path.join(out, "predict_batch.npz"), served, report])
    with open(report) as handle, open(os.path.join(saved_model, "tf_dlrm_serving.json")) as info:
        return {"out": str(out), "served": np.load(served), "bad": json.load(handle), "info": json.load(info),
                "batch": dict(np.load(os.path.join(out, "predict_batch.npz")))}


def test_served_multi_hot_model_predicts_like_the_training_model(exported):
    batch = exported["batch"]
    lengths = batch["cat_1_bin_row_lengths"]
    # The batch the comparison rests on does hold short ragged rows and full fixed ones.
    assert lengths.min() == 1 and lengths.max() == 3 and (lengths < 3).any()
    assert batch["cat_2_bin"].shape == (128, 2) and batch["categorical"].shape == (128, 1)
    trained = np.load(os.path.join(exported["out"], "predict_predictions.npy"))
    assert exported["served"].shape == trained.shape == (128,)
    # Both run the same float32 graph on the same weights: only TensorFlow's op choice may differ.
    np.testing.assert_allclose(exported["served"], trained, rtol=0, atol=1e-6)
    assert trained.std() > 1e-3  # the model is not a constant


def test_serving_info_names_each_multi_hot_input(exported):
    inputs = exported["info"]["inputs"]
    assert sorted(inputs) == ["cat_1_bin_row_lengths", "cat_1_bin_values", "cat_2_bin", "categorical", "numerical"]
    assert inputs["categorical"]["columns"] == ["cat_0.bin"]
    assert inputs["cat_2_bin"] == {"dtype": "int64", "shape": [None, 2], "feature": "cat_2.bin", "hotness": 2,
                                   "cardinality": 2500}
    assert inputs["cat_1_bin_values"]["feature"] == "cat_1.bin" and inputs["cat_1_bin_values"]["hotness"] == 3


def test_wrong_multi_hot_input_is_refused_with_its_message(exported):
    found = exported["bad"]
    expected = {
        "cat_1_bin_row_too_long": "serving input 'cat_1_bin': feature 'cat_1.bin' holds at most hotness=3 ids per "
                                  "sample. Received: sample] [3] [holds] [4] [ids]",
        "cat_1_bin_lengths_sum": "serving inputs 'cat_1_bin_row_lengths' and 'cat_1_bin_values': the row lengths must "
                                 "sum to the number of values",
        "cat_1_bin_id_outside": "serving input 'cat_1_bin': ids of feature 'cat_1.bin' must lie in [0, 300). Received: "
                                "sample] [3] [holds id] [300]",
        "cat_2_bin_wider": "serving input 'cat_2_bin': expected shape [batch, 2] (int64 values). Received shape:] [128 3]",
        "cat_2_bin_id_outside": "serving input 'cat_2_bin': ids of feature 'cat_2.bin' must lie in [0, 2500). Received: "
                                "sample] [3] [holds id] [2500]",
        "cat_2_bin_batch_sizes_differ": "must hold the same number of samples",
        "categorical_9_columns": "serving input 'categorical': expected shape [batch, 1] (one id per categorical "
                                 "feature ['cat_0.bin'])",
        "id_outside": "sample] [5] [feature] [cat_0.bin] [holds id] [7]",
    }
    for case, fragment in expected.items():
        assert fragment in found[case], (case, found[case])
