"""Evaluation gathers every rank's rows to rank 0 rank after rank; rank 0 puts them back in the
split's order (each global batch: rank 0's local rows, then rank 1's, ...) before trimming the
padding of the last batch. Checked on the layout the reader makes, where a wrong order would trim
real rows and keep padding."""

from __future__ import annotations

import numpy as np
import pytest

from tf_dlrm.train.loop import restore_split_order


@pytest.mark.parametrize("world_size, local, samples", [(2, 4, 29), (3, 5, 31), (4, 8, 33), (1, 6, 13)])
def test_rows_gathered_rank_after_rank_return_to_the_split_order(world_size, local, samples):
    batches = -(-samples // (world_size * local))
    split = np.arange(batches * world_size * local, dtype=np.float32)  # rows past `samples` are padding
    rows = np.stack([split, split * 10], axis=1)
    per_rank = [np.concatenate([rows[(b * world_size + r) * local:(b * world_size + r + 1) * local] for b in range(batches)])
                for r in range(world_size)]
    gathered = np.concatenate(per_rank)  # what the alltoall to rank 0 delivers
    sizes = np.full(world_size * batches, local, np.int32)
    ordered = restore_split_order(gathered, np.full(world_size, local * batches), sizes, world_size)
    np.testing.assert_array_equal(ordered[:samples], rows[:samples])
    # The general path (batch sizes not all equal: here one more, empty, batch on every rank) gives the same.
    ordered = restore_split_order(gathered, np.full(world_size, local * batches),
                                  np.tile(np.r_[np.full(batches, local), 0], world_size).astype(np.int32), world_size)
    np.testing.assert_array_equal(ordered[:samples], rows[:samples])
