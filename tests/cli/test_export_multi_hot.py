"""--mode=export of a multi-hot model and of a dynamic-table model, served by plain TensorFlow in a process
where tf_dlrm cannot be imported (tests/cli/serve_saved_model.py: no path to it, no PYTHONPATH, run outside the
repository), score what ``--mode=eval`` scores.

- A DCNv2 on NVIDIA's split_tfrecords layout with a one-hot, a ragged (1 to 3 ids per sample) and a
  fixed-hotness (2 ids) feature;
- a DCNv2 on dynamic tables (``tf_dlrm.data.synthetic --hashed_keys``: raw int64 keys, unseen ones in the
  validation split; dynamic tables take one width);
- a DCNv2 on dynamic tables beside fixed ones (``feature_specs/synthetic_multi_hot.yaml`` with three features made
  dynamic: one-hot, 5 ids mean-pooled, 2 ids summed; the fixed ones of widths 8 and 16, multi-hot too).

One process trains each a few steps, evaluates the checkpoint (``--mode=eval``), exports it (``--mode=export``)
and writes the whole validation split as the signature's inputs. The served scores of that split give
``--mode=eval``'s AUC and logloss within 1e-6 (the same float32 graph on the same weights; only TensorFlow's op
choice may differ), and the first batch's scores equal the training model's within 1e-6. Both take the one
serving signature (one input per feature, a ragged one as values and row lengths; a dynamic table's raw keys).
Wrong serving input (widths, ids, row lengths, batch sizes, dtypes) is refused with its message."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, run_python

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data"))
from test_split_tfrecords import write_dataset  # noqa: E402

FLAGS = ["--dataset_type=split_tfrecords", "--model=dcnv2", "--embedding_dim=8", "--deep_mlp_dims=16",
         "--num_cross_layers=2", "--cross_low_rank=4", "--batch_size=64", "--valid_batch_size=128", "--epochs=1", "--learning_rate=0.5",
         "--optimizer=sgd", "--embedding_optimizer=sgd", "--print_freq=1000", "--evals_per_epoch=0", "--seed=3"]
DYNAMIC_FLAGS = ["--model=dcnv2", "--embedding_dim=8", "--deep_mlp_dims=16", "--num_cross_layers=2",
                 "--cross_low_rank=4", "--batch_size=192", "--valid_batch_size=250", "--epochs=1", "--learning_rate=0.05",
                 "--optimizer=adam", "--embedding_optimizer=adagrad", "--print_freq=1000", "--evals_per_epoch=0", "--seed=3",
                 "--calibration=none"]  # the worker's predictions are the model's own: compared with what is served
SERVE = os.path.join(REPO, "tests", "cli", "serve_saved_model.py")


def serve_alone(saved_model: str, batch: str, out: str, *more: str, cwd: str) -> None:
    """serve_saved_model.py in a process started outside the repository with no PYTHONPATH (the script also
    removes every way to import tf_dlrm, and checks)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    completed = subprocess.run([sys.executable, SERVE, saved_model, batch, out, *more], cwd=cwd, capture_output=True,
                               text=True, env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]


def tasks_of(name: str, flags: list, out: str) -> list:
    checkpoints, saved_model = os.path.join(out, f"{name}_checkpoints"), os.path.join(out, f"{name}_saved_model")
    restore = flags + [f"--restore_checkpoint_path={checkpoints}"]
    return [
        {"name": f"{name}_train", "action": "train", "argv": flags + [f"--save_checkpoint_path={checkpoints}"]},
        {"name": f"{name}_predict", "action": "predict", "argv": restore, "whole_split": True},
        {"name": f"{name}_eval", "action": "mode", "argv": restore + ["--mode=eval"]},
        {"name": f"{name}_export", "action": "mode", "argv": restore + ["--mode=export", f"--saved_model_path={saved_model}"]},
    ]


def write_mixed_spec(directory) -> None:
    """``mixed.yaml`` beside the dataset's spec: three of its categorical features dynamic (one width: 16)."""
    import yaml

    spec = yaml.safe_load((directory / "feature_spec.yaml").read_text())
    for name in ("cat_2.bin", "cat_3.bin", "cat_4.bin"):
        properties = spec["feature_spec"][name]
        properties.update(dynamic=True, capacity=properties["cardinality"], embedding_dim=16)
    (directory / "mixed.yaml").write_text(yaml.safe_dump(spec))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One process trains both models, evaluates, predicts and exports them; a TensorFlow-only process serves."""
    from tf_dlrm.data.hidden_model import GeneratorConfig
    from tf_dlrm.data.synthetic import generate
    from tf_dlrm.spec.feature_spec import FeatureSpec

    data, keys = tmp_path_factory.mktemp("multi_hot_data"), tmp_path_factory.mktemp("dynamic_data")
    out = str(tmp_path_factory.mktemp("multi_hot_export"))
    write_dataset(str(data), num_prebatches=20, variable=True, fixed=(2,))
    spec = FeatureSpec.load(os.path.join(REPO, "feature_specs", "synthetic_small.yaml"), check_files=False)
    generate(spec, str(keys), 1536, 1000, seed=3, config=GeneratorConfig(hashed_keys=True))
    mixed = tmp_path_factory.mktemp("mixed_data")
    generate(FeatureSpec.load(os.path.join(REPO, "feature_specs", "synthetic_multi_hot.yaml"), check_files=False),
             str(mixed), 1536, 1000, seed=3)
    write_mixed_spec(mixed)
    tasks = (tasks_of("multi_hot", [f"--dataset_path={data}", *FLAGS], out)
             + tasks_of("dynamic", [f"--dataset_path={keys}", *DYNAMIC_FLAGS], out)
             + tasks_of("mixed", [f"--dataset_path={mixed}", "--feature_spec=mixed.yaml", *DYNAMIC_FLAGS], out))
    with open(os.path.join(out, "tasks.json"), "w") as handle:
        json.dump(tasks, handle)
    run_python(["tests/checkpoint/checkpoint_worker.py", os.path.join(out, "tasks.json"), out])
    with open(os.path.join(out, "results.json")) as handle:
        results = json.load(handle)
    found = {}
    for name in ("multi_hot", "dynamic", "mixed"):
        saved_model, stem = os.path.join(out, f"{name}_saved_model"), os.path.join(out, f"{name}_predict")
        more = [f"{stem}_split.npz={stem}_split_served.npy", os.path.join(out, f"{name}_bad.json")]
        serve_alone(saved_model, f"{stem}_batch.npz", f"{stem}_served.npy", *more, cwd=str(tmp_path_factory.mktemp("serve")))
        with open(os.path.join(saved_model, "tf_dlrm_serving.json")) as info:
            found[name] = {"served": np.load(f"{stem}_served.npy"), "split_served": np.load(f"{stem}_split_served.npy"),
                           "labels": np.load(f"{stem}_split_labels.npy"), "info": json.load(info),
                           "batch": dict(np.load(f"{stem}_batch.npz")), "trained": np.load(f"{stem}_predictions.npy"),
                           "eval": results[f"{name}_eval"]}
        with open(os.path.join(out, f"{name}_bad.json")) as handle:
            found[name]["bad"] = json.load(handle)
    return found


@pytest.fixture(scope="module")
def exported(runs):
    return runs["multi_hot"]


@pytest.mark.parametrize("name", ["multi_hot", "dynamic", "mixed"])
def test_served_alone_scores_what_eval_scores(runs, name):
    from tf_dlrm.metrics import ClickMetrics

    run = runs[name]
    labels = run["labels"]
    scores = run["split_served"][: len(labels)]
    served = ClickMetrics.of(labels, scores)
    evaluated = run["eval"]
    assert evaluated["samples"] == len(labels) == {"multi_hot": 640, "dynamic": 1000, "mixed": 1000}[name]
    print(f"{name}: --mode=eval AUC {evaluated['auc']:.9f} logloss {evaluated['logloss']:.9f}; served by TensorFlow "
          f"alone AUC {served.auc:.9f} logloss {served.logloss:.9f}; |difference| AUC "
          f"{abs(served.auc - evaluated['auc']):.3g} logloss {abs(served.logloss - evaluated['logloss']):.3g}; first "
          f"batch vs the training model: max abs difference {np.abs(run['served'] - run['trained']).max():.3g}")
    assert abs(served.auc - evaluated["auc"]) <= 1e-6 and abs(served.logloss - evaluated["logloss"]) <= 1e-6
    np.testing.assert_allclose(run["served"], run["trained"], rtol=0, atol=1e-6)
    assert run["trained"].std() > 1e-3  # the model is not a constant


def test_dynamic_export_takes_raw_keys_and_refuses_wrong_input(runs):
    run = runs["dynamic"]
    names = [f"cat_{i}_bin" for i in range(8)]
    assert sorted(run["batch"]) == sorted(["numerical", *names]) and list(run["info"]["inputs"]) == ["numerical", *names]
    keys = np.stack([run["batch"][name] for name in names], axis=1)
    assert keys.shape == (250, 8) and keys.dtype == np.int64 and np.abs(keys).max() > 2**40  # raw hashed keys
    assert run["info"]["inputs"]["cat_0_bin"] == {"dtype": "int64", "shape": [None], "feature": "cat_0.bin", "hotness": 1,
                                                  "ragged": False, "cardinality": None}
    found = run["bad"]
    # Raw keys have no range: a key no table saw reads zeros (test_dynamic_main_checkpoint.py), as in evaluation.
    for name in names:
        assert found.pop(f"{name}_id_outside") == "scored"
    expected = {"numerical_12_columns": "serving input 'numerical': expected shape [batch, 13]",
                "numerical_float64": "was expected to be a float tensor but is a double tensor"}
    for name in names:
        feature = name.replace("_bin", ".bin")
        expected.update({
            f"{name}_two_ids": f"serving input '{name}': expected shape [batch] (int64 values of '{feature}'). Received "
                               "shape:] [250 2]",
            f"{name}_batch_sizes_differ": f"serving inputs 'numerical' and '{name}' must hold the same number of samples "
                                          f"(one row each). Received: 'numerical'] [250] [rows, '{name}'] [249] [rows]",
            f"{name}_int32": "was expected to be a int64 tensor but is a int32 tensor",
        })
    assert sorted(found) == sorted(expected)
    for case, fragment in expected.items():
        assert fragment in found[case], (case, found[case])


def test_served_multi_hot_model_predicts_like_the_training_model(exported):
    batch = exported["batch"]
    lengths = batch["cat_1_bin_row_lengths"]
    # The batch the comparison rests on does hold short ragged rows and full fixed ones.
    assert lengths.min() == 1 and lengths.max() == 3 and (lengths < 3).any()
    assert batch["cat_2_bin"].shape == (128, 2) and batch["cat_0_bin"].shape == (128,)
    assert exported["served"].shape == exported["trained"].shape == (128,)
    # Both run the same float32 graph on the same weights: only TensorFlow's op choice may differ.
    np.testing.assert_allclose(exported["served"], exported["trained"], rtol=0, atol=1e-6)


def test_serving_info_names_each_input(exported):
    inputs = exported["info"]["inputs"]
    assert list(inputs) == ["numerical", "cat_0_bin", "cat_1_bin_values", "cat_1_bin_row_lengths", "cat_2_bin"]
    assert inputs["cat_0_bin"] == {"dtype": "int64", "shape": [None], "feature": "cat_0.bin", "hotness": 1,
                                   "ragged": False, "cardinality": 7}
    assert inputs["cat_2_bin"] == {"dtype": "int64", "shape": [None, 2], "feature": "cat_2.bin", "hotness": 2,
                                   "ragged": False, "cardinality": 2500}
    assert inputs["cat_1_bin_values"]["feature"] == "cat_1.bin" and inputs["cat_1_bin_values"]["hotness"] == 3
    assert inputs["cat_1_bin_row_lengths"]["ragged"] is True and inputs["cat_1_bin_row_lengths"]["shape"] == [None]


def test_wrong_multi_hot_input_is_refused_with_its_message(exported):
    """Shapes, batch sizes and row lengths are the signature's checks (naming the serving input); ids past a
    table and rows past a feature's hotness are the embedding layer's (naming the feature)."""
    found = exported["bad"]
    expected = {
        "cat_1_bin_row_too_long": "feature 'cat_1.bin': a sample has more ids than its hotness 3",
        "cat_1_bin_lengths_sum": "serving inputs 'cat_1_bin_row_lengths' and 'cat_1_bin_values': the row lengths must "
                                 "sum to the number of values",
        "cat_1_bin_id_outside": "feature 'cat_1.bin': an id is outside [0, 300)",
        "cat_2_bin_wider": "serving input 'cat_2_bin': expected shape [batch, 2] (int64 values of 'cat_2.bin'). Received "
                           "shape:] [128 3]",
        "cat_2_bin_id_outside": "feature 'cat_2.bin': an id is outside [0, 2500)",
        "cat_2_bin_batch_sizes_differ": "must hold the same number of samples",
        "cat_2_bin_int32": "was expected to be a int64 tensor but is a int32 tensor",
        "cat_0_bin_int32": "was expected to be a int64 tensor but is a int32 tensor",
        "numerical_float64": "was expected to be a float tensor but is a double tensor",
        "cat_0_bin_two_ids": "serving input 'cat_0_bin': expected shape [batch] (int64 values of 'cat_0.bin'). Received "
                             "shape:] [128 2]",
        "cat_0_bin_id_outside": "feature 'cat_0.bin': an id is outside [0, 7)",
        "cat_0_bin_batch_sizes_differ": "serving inputs 'numerical' and 'cat_0_bin' must hold the same number of "
                                        "samples (one row each). Received: 'numerical'] [128] [rows, 'cat_0_bin'] [127]",
        "numerical_12_columns": "serving input 'numerical': expected shape [batch, ",
    }
    assert sorted(found) == sorted(expected)
    for case, fragment in expected.items():
        assert fragment in found[case], (case, found[case])
    assert "scored" not in found.values(), found  # every wrong variant refused, none scored in silence


def test_mixed_export_serves_dynamic_keys_beside_fixed_ids(runs):
    """The fixed tables' inputs keep their id range, the dynamic ones take raw keys (no cardinality); multi-hot
    inputs of both kinds are ``[batch, hotness]``."""
    inputs = runs["mixed"]["info"]["inputs"]
    assert inputs["cat_1_bin"] == {"dtype": "int64", "shape": [None, 3], "feature": "cat_1.bin", "hotness": 3,
                                   "ragged": False, "cardinality": 16}
    assert inputs["cat_2_bin"] == {"dtype": "int64", "shape": [None], "feature": "cat_2.bin", "hotness": 1,
                                   "ragged": False, "cardinality": None}
    assert inputs["cat_3_bin"] == {"dtype": "int64", "shape": [None, 5], "feature": "cat_3.bin", "hotness": 5,
                                   "ragged": False, "cardinality": None}
    assert inputs["cat_4_bin"]["cardinality"] is None and inputs["cat_5_bin"]["cardinality"] is not None
