"""scripts/print_auc.py, the demo's last line: the held-out figure beside the oracle of the same split."""

from __future__ import annotations

import importlib.util
import os

from conftest import REPO

_spec = importlib.util.spec_from_file_location("print_auc", os.path.join(REPO, "scripts", "print_auc.py"))
print_auc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(print_auc)

METADATA = {"oracle_valid_auc": 0.84, "oracle_test_auc": 0.83}
COMMON = {"train_samples_per_s": 12345.6, "world_size": 2}


def test_the_test_figure_beside_the_test_oracle():
    final = {"auc": 0.835, "split": "validation", "selected_on": "validation", "best_step": 300, "steps": 500,
             "test_auc": 0.8275, "test_split": "test", **COMMON}
    assert print_auc.describe(final, METADATA) == (
        "test (test) AUC 0.8275 (oracle 0.8300, gap 0.0025; state of step 300 of 500, chosen on validation); "
        "12,346 samples/s on 2 ranks")


def test_without_a_test_split_the_evaluated_split_and_its_own_oracle():
    final = {"auc": 0.82, "split": "validation", "selected_on": None, "steps": 500, **COMMON}
    assert print_auc.describe(final, METADATA).startswith(
        "validation (validation) AUC 0.8200 (oracle 0.8400, gap 0.0200; state of step 500); ")
    final = {"auc": 0.81, "split": "test", "selected_on": None, "steps": 500, **COMMON}
    assert print_auc.describe(final, METADATA).startswith("test (test) AUC 0.8100 (oracle 0.8300, gap 0.0200; ")
    assert "no oracle AUC for this split" in print_auc.describe(final, {"oracle_valid_auc": 0.84})
