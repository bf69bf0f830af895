"""Every --model through main.py's paths: checkpoints resharded, eval, inference, SavedModel export.

Per model (dlrm, dcnv2, deepfm, wide_deep) on the checkpoint tests' tiny synthetic dataset:

- ``-np 2`` column-wise trains 10 steps (row-wise Adagrad + Adam) and saves a checkpoint;
- ``-np 3`` table-wise restores it (a different plan: the tables are resharded) and predicts the
  first validation batch; one process does the same, then runs ``--mode=eval``,
  ``--mode=inference`` and ``--mode=export``;
- a fresh interpreter that never imports tf_dlrm serves the SavedModels on those batches (one for all models),
  each taking the one signature: ``numerical`` and one input per column of the spec.

Scores agree within 1e-6 (float32 sums of a few dozen terms of size ~1 in different orders).
Wide & Deep reads a copy of the spec with two crossed features and trains its wide tables with FTRL
(its state checkpointed and resharded like the row-wise Adagrad state of the deep tables).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
import yaml

# checkpoint_runs (beside test_checkpoint.py) caches the launches these files share.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "checkpoint"))
from checkpoint_runs import dataset, model_flags, run_worker  # noqa: E402
from conftest import run_python  # noqa: E402

pytestmark = pytest.mark.multirank

MODELS = ("dlrm", "dcnv2", "deepfm", "wide_deep")
STEPS = 10
_cache: dict = {}


def flags_of(model: str, data: str) -> list[str]:
    # Each model's own flags only: a flag of another model is refused.
    own = {"dlrm": [], "dcnv2": ["--deep_mlp_dims=16", "--num_cross_layers=2", "--cross_low_rank=4"],
           "deepfm": ["--deep_mlp_dims=16"], "wide_deep": ["--deep_mlp_dims=16"]}[model]
    common = [f for f in model_flags(data) if model == "dlrm" or not f.startswith(("--bottom_mlp_dims", "--top_mlp_dims"))]
    flags = common + [f"--model={model}", *own, f"--max_steps={STEPS}"]
    if model == "wide_deep":
        flags += ["--feature_spec=feature_spec_crossed.yaml", "--wide_optimizer=ftrl", "--wide_learning_rate=0.05"]
    return flags


def runs(tmp_path_factory) -> dict:
    if "runs" in _cache:
        return _cache["runs"]
    data = dataset(tmp_path_factory)
    with open(os.path.join(data, "feature_spec.yaml")) as handle:
        spec = yaml.safe_load(handle)
    spec["crossed_features"] = [{"features": ["cat_3.bin", "cat_4.bin"], "buckets": 997},
                                {"features": ["cat_0.bin", "cat_7.bin"], "buckets": 101}]
    with open(os.path.join(data, "feature_spec_crossed.yaml"), "w") as handle:
        yaml.safe_dump(spec, handle, sort_keys=False)
    out = str(tmp_path_factory.mktemp("model_family"))
    save = {m: os.path.join(out, f"ckpt_{m}") for m in MODELS}
    train = [{"name": f"train_{m}", "action": "train",
              "argv": flags_of(m, data) + ["--dist_strategy=column_wise", f"--save_checkpoint_path={save[m]}"]} for m in MODELS]
    trained = run_worker(2, train, out)
    resharded_dir = os.path.join(out, "np3")
    os.makedirs(resharded_dir)
    resharded = run_worker(3, [{"name": f"predict_{m}", "action": "predict",
                                "argv": flags_of(m, data) + ["--dist_strategy=table_wise", f"--restore_checkpoint_path={save[m]}"]}
                               for m in MODELS], resharded_dir)
    tasks = []
    for m in MODELS:
        restore = flags_of(m, data) + [f"--restore_checkpoint_path={save[m]}"]
        tasks += [
            {"name": f"predict_{m}", "action": "predict", "argv": restore},
            {"name": f"eval_{m}", "action": "mode", "argv": restore + ["--mode=eval"]},
            {"name": f"inference_{m}", "action": "mode", "argv": restore + ["--mode=inference", "--inference_batch_sizes=1,64", "--max_steps=5"]},
            {"name": f"export_{m}", "action": "mode", "argv": restore + ["--mode=export", f"--saved_model_path={out}/saved_{m}"]},
        ]
    single = run_worker(1, tasks, out)
    # One fresh interpreter that never imports tf_dlrm serves every model's SavedModel on its batch.
    served = []
    for m in MODELS:
        served += ["--", os.path.join(out, f"saved_{m}"), os.path.join(out, f"predict_{m}_batch.npz"),
                   os.path.join(out, f"served_{m}.npy")]
    run_python(["tests/cli/serve_saved_model.py", *served[1:]])
    _cache["runs"] = {"out": out, "resharded_dir": resharded_dir, "trained": trained, "resharded": resharded, "single": single}
    return _cache["runs"]


@pytest.mark.parametrize("model", MODELS)
def test_model_checkpoint_reshards_and_exports(model, tmp_path_factory):
    run = runs(tmp_path_factory)
    trained = run["trained"][f"train_{model}"]
    assert trained["steps"] == STEPS and trained["world_size"] == 2
    single, resharded = run["single"][f"predict_{model}"], run["resharded"][f"predict_{model}"]
    assert single["step"] == resharded["step"] == STEPS
    one_process = np.load(os.path.join(run["out"], f"predict_{model}_predictions.npy"))
    three_ranks = np.load(os.path.join(run["resharded_dir"], f"predict_{model}_predictions.npy"))
    np.testing.assert_allclose(three_ranks, one_process, rtol=0, atol=1e-6)
    assert abs(single["auc"] - resharded["auc"]) <= 1e-6
    evaluated = run["single"][f"eval_{model}"]
    # 10 steps on 1,920 samples: the AUC is near 0.5 (benchmarks/quality.py measures learning).
    assert abs(evaluated["auc"] - single["auc"]) <= 1e-6
    assert run["single"][f"inference_{model}"]["world_size"] == 1
    saved = os.path.join(run["out"], f"saved_{model}")
    with open(os.path.join(saved, "tf_dlrm_serving.json")) as handle:
        info = json.load(handle)
    assert info["model"] == model
    # One input per column of the spec: the features DeepFM and Wide & Deep derive are made inside the model.
    assert list(info["inputs"]) == ["numerical", *[f"cat_{i}_bin" for i in range(8)]], list(info["inputs"])
    np.testing.assert_allclose(np.load(os.path.join(run["out"], f"served_{model}.npy")), one_process, rtol=0, atol=1e-6)
