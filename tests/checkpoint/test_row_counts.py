"""The frequency regularizer's row counts (``--embedding_frequency_l2``, ``--embedding_min_count``) in checkpoints.

Trained 10 steps with ``-np 2`` column-wise (checkpoints at 5 and 10), then resumed from step 5 with
``-np 3`` table-wise to step 10: the counts of every table are saved once per table as ``[rows, 1]``
(a copy lives in every column slice), restored into the other plan, and the step-10 checkpoints
agree: counts exactly (integers in float32), everything else within 1e-5 (3 ranks sum the same
gradients in another order than 2, as in test_resume.py). A checkpoint saved without the regularizer
restores under it, its counts starting at zero.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from checkpoint_runs import EVERY, STEPS, checkpoint_arrays, ckpt, dataset, max_difference, model_flags, run_worker
from tf_dlrm.checkpoint import store as checkpoint_store

pytestmark = pytest.mark.multirank
FREQUENCY = ["--embedding_frequency_l2=0.1", "--embedding_min_count=2"]


def train(tmp_path_factory, name: str, ranks: int, strategy: str, extra: list[str], frequency=FREQUENCY) -> str:
    out = str(tmp_path_factory.mktemp(name))
    save = os.path.join(out, "checkpoints")
    flags = model_flags(dataset(tmp_path_factory)) + frequency + [f"--dist_strategy={strategy}"]
    run_worker(ranks, [{"name": "train", "action": "train", "argv": flags + [
        f"--max_steps={STEPS}", f"--checkpoint_every_steps={EVERY}", f"--save_checkpoint_path={save}",
        f"--log_path={out}/train.jsonl", *extra]}], out)
    return save


def test_counts_are_saved_per_table_and_resharded_on_resume(tmp_path_factory):
    straight = train(tmp_path_factory, "counts_straight", 2, "column_wise", [])
    directory = ckpt(straight, STEPS)
    manifest = checkpoint_store.read_manifest(directory)
    counts = [e for e in manifest["embedding_state"] if e["slot"] == "row_count"]
    assert [e["name"] for e in counts] == [f"row_count/table_{t:03d}" for t in range(len(manifest["tables"]))]
    assert all(e["row_wise"] for e in counts)
    arrays = checkpoint_arrays(directory)
    for entry, table in zip(counts, manifest["tables"]):
        values = arrays[f"embedding_state/{entry['name']}"]
        assert values.shape == (table["rows"], 1)
        assert (values == np.round(values)).all() and 0 <= values.min() and values.max() <= STEPS
    assert max(arrays[f"embedding_state/{e['name']}"].max() for e in counts) == STEPS  # a row of every batch

    resumed = train(tmp_path_factory, "counts_resumed", 3, "table_wise",
                    [f"--restore_checkpoint_path={ckpt(straight, EVERY)}"])
    mine, theirs = checkpoint_arrays(ckpt(resumed, STEPS)), arrays
    for entry in counts:
        name = f"embedding_state/{entry['name']}"
        np.testing.assert_array_equal(mine[name], theirs[name], err_msg=name)
    difference, where = max_difference(ckpt(resumed, STEPS), directory)
    assert difference <= 1e-5, f"largest difference {difference} in {where}"


def test_a_checkpoint_without_counts_restores_with_counts_at_zero(tmp_path_factory):
    plain = train(tmp_path_factory, "counts_absent", 2, "column_wise", [],
                  frequency=["--embedding_frequency_l2=0", "--embedding_min_count=1"])
    saved = checkpoint_store.read_manifest(ckpt(plain, EVERY))
    assert not [e for e in saved["embedding_state"] if e["slot"] == "row_count"]
    resumed = train(tmp_path_factory, "counts_from_zero", 2, "column_wise",
                    [f"--restore_checkpoint_path={ckpt(plain, EVERY)}"])
    arrays = checkpoint_arrays(ckpt(resumed, STEPS))
    counts = [a for name, a in arrays.items() if name.startswith("embedding_state/row_count/")]
    assert counts and max(a.max() for a in counts) == STEPS - EVERY  # counted from the restore on
