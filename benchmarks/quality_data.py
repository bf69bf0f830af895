"""Datasets of the quality benchmarks, made the way a user would: synthetic specs with their oracle
AUC, and the real Criteo sample rows of ``$TF_DLRM_CRITEO_SAMPLES`` (default ``../shared/data``) through ``python -m preprocessing.criteo``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES = os.environ.get("TF_DLRM_CRITEO_SAMPLES") or os.path.join(os.path.dirname(REPO), "shared", "data")
DATASETS = ("synthetic_small", "criteo_sample")


def make_dataset(name: str, directory: str, num_train: int, num_valid: int, seed: int = 1) -> str:
    """Writes dataset ``name`` under ``directory`` (once); returns its path."""
    path = os.path.join(directory, f"{name}_{num_train}_{num_valid}_{seed}")
    if os.path.isfile(os.path.join(path, "feature_spec.yaml")):
        return path
    if name == "synthetic_small":
        from tf_dlrm.data.synthetic import generate
        from tf_dlrm.spec.feature_spec import FeatureSpec

        spec = FeatureSpec.load(os.path.join(REPO, "feature_specs", "synthetic_small.yaml"), check_files=False)
        generate(spec, path, num_train_samples=num_train, num_valid_samples=num_valid, seed=seed)
    elif name == "criteo_sample":
        # The 1,000 real rows of the 1TB day 0 sample (the 200 Kaggle rows come from another distribution),
        # the last 20% by row order as validation: a smoke-sized quality check, not a benchmark of record.
        inputs = [os.path.join(SAMPLES, "criteo_1tb_day0_sample_1k.tsv")]
        subprocess.run(
            [sys.executable, "-m", "preprocessing.criteo", f"--input={','.join(inputs)}", f"--output_dir={path}",
             "--split=fraction", "--test_fraction=0.2", "--valid_fraction=0", "--frequency_threshold=2"],
            cwd=REPO, check=True, capture_output=True,
        )
    else:
        raise ValueError(f"Expected a dataset in {DATASETS}. Received: {name!r}")
    return path


def oracle_auc(path: str) -> float | None:
    with open(os.path.join(path, "feature_spec.yaml")) as handle:
        return (yaml.safe_load(handle).get("metadata") or {}).get("oracle_valid_auc")


def run_main(path: str, flags: list[str], log_path: str, ranks: int = 1) -> dict:
    """``main.py`` on ``path`` with ``flags`` (a subprocess, as a user runs it); its final JSON record."""
    command = [sys.executable, "main.py", f"--dataset_path={path}", f"--log_path={log_path}", *flags]
    if ranks > 1:
        command = [os.path.join(os.path.dirname(sys.executable), "horovodrun"), "-np", str(ranks), "-H",
                   f"localhost:{ranks}", "--gloo", *command]
    completed = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if completed.returncode != 0:
        return {"error": (completed.stdout + completed.stderr)[-2000:]}
    with open(log_path) as handle:
        lines = [json.loads(line) for line in handle]
    return lines[-1]
