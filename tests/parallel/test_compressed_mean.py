"""bfloat16_mean (tf_dlrm.parallel.compressed_mean) at 2, 3 and 4 ranks: every rank gets the same
mean, within 2 u (u = 2**-8, bf16's unit roundoff) of the exact mean relative to mean_r |g_r|: one
rounding of each rank's input, one of the float32 sum's mean (float32's own error is 2**16 smaller,
covered by the 2.05 instead of 2)."""

import json

import pytest

from arithmetic import BFLOAT16_UNIT_ROUNDOFF
from conftest import launch


@pytest.mark.multirank
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_bfloat16_mean_equals_the_exact_mean_within_two_roundings(world_size, tmp_path):
    launch(world_size, ["tests/parallel/compressed_mean_worker.py", str(tmp_path)], timeout=300)
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world_size)]
    assert all(r["values"] == records[0]["values"] for r in records)  # identical on every rank
    worst = max(r["worst_relative"] for r in records)
    assert worst <= 2.05 * BFLOAT16_UNIT_ROUNDOFF, worst
    assert worst > 2.0**-20  # it did round to bf16: not a float32 allreduce in disguise
