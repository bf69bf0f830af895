"""Dynamic-table checkpoints: saved by 2 ranks, restored on 3 (every key re-routed to its new owner),
training continued: equal to one uninterrupted run (rows, optimizer state, MLP, logits).

Tolerances: rows, state and MLP within 1e-5 absolute, logits within 1e-6 (the same float32
reduction-order argument as test_dynamic_equivalence.py; the restore itself copies exact values).
Adam's epsilon is 1e-4 here, as in tests/embedding/test_equivalence.py: these embedding gradients
are ~1e-5 (sqrt(v) ~ 1e-5), and with epsilon 1e-8 lazy Adam's step lr * m / sqrt(v) does not depend on
the gradient's size, so a gradient that cancels to a few units of roundoff moves a weight by up to
lr times its *relative* rounding noise (seen: 1.16e-5 after 6 steps at lr 0.1, from 2 ranks then 3
against 1 process); with epsilon above sqrt(v) the step is proportional to the gradient again.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import launch, run_python

CASE = {"seed": 5, "global_batch": 24, "learning_rate": 0.1, "new_keys_per_step": 6, "first_steps": 3, "second_steps": 3,
        "embedding_optimizer": "lazy_adam", "adam_epsilon": 1e-4,
        "tables": [{"name": "a", "capacity": 300, "width": 4, "eviction": "lru"},
                   {"name": "b", "capacity": 300, "width": 4, "min_count": 2, "max_idle_steps": 2}]}
WORKER = "tests/embedding/dynamic/dynamic_checkpoint_worker.py"


@pytest.mark.multirank
def test_save_at_2_restore_at_3_continues_like_one_run(tmp_path):
    case_path = tmp_path / "case.json"
    case_path.write_text(json.dumps(CASE))
    interrupted, uninterrupted = tmp_path / "interrupted", tmp_path / "uninterrupted"
    interrupted.mkdir()
    uninterrupted.mkdir()
    launch(2, [WORKER, "save", str(case_path), str(interrupted)])
    saved = sorted(p.name for p in (interrupted / "dynamic").iterdir())
    assert saved == ["dynamic_rank0.npz", "dynamic_rank1.npz", "dynamic_tables.json"]
    launch(3, [WORKER, "resume", str(case_path), str(interrupted)])
    run_python([WORKER, "uninterrupted", str(case_path), str(uninterrupted)])
    resumed, expected = np.load(interrupted / "result.npz"), np.load(uninterrupted / "result.npz")
    assert sorted(resumed.files) == sorted(expected.files)
    for name in expected.files:
        if name.endswith("_keys"):
            np.testing.assert_array_equal(resumed[name], expected[name], err_msg=name)
            assert len(expected[name]) > 20
        else:
            tolerance = 1e-6 if name == "logits" else 1e-5
            difference = float(np.max(np.abs(resumed[name] - expected[name]), initial=0.0))
            print(f"{name}: max abs difference {difference}")
            assert difference <= tolerance, f"{name} differs by {difference}"
