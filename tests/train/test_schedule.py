"""NVIDIA's learning-rate schedule, in Python and as a tensor."""

from __future__ import annotations

import numpy as np
import pytest

from tf_dlrm.optimizers.settings import LearningRateSchedule


def test_warmup_constant_decay_by_hand():
    schedule = LearningRateSchedule(base=1.0, warmup_steps=4, decay_start_step=6, decay_steps=4)
    expected = [0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 0.5625, 0.25, 0.0625, 0.0, 0.0]
    assert [schedule(s) for s in range(12)] == pytest.approx(expected)


def test_tensor_version_matches_python():
    schedule = LearningRateSchedule(base=0.3, warmup_steps=10, decay_start_step=50, decay_steps=30)
    steps = np.arange(100)
    np.testing.assert_allclose(schedule.tensor(steps).numpy(), [schedule(int(s)) for s in steps], rtol=1e-6)


def test_no_warmup_no_decay_is_constant():
    schedule = LearningRateSchedule(base=0.1)
    assert {schedule(s) for s in range(50)} == {0.1}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"base": 0.0}, "positive learning rate"),
        ({"base": 0.1, "warmup_steps": -1}, "warmup_steps=-1"),
        ({"base": 0.1, "warmup_steps": 10, "decay_start_step": 5, "decay_steps": 3}, "decay must start after the warmup"),
    ],
)
def test_invalid_schedules(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LearningRateSchedule(**kwargs)
