"""NVIDIA's DLRM learning-rate schedule: linear warmup, constant, then polynomial decay of power 2.

For step ``s`` (counted from 0), base rate ``r``, warmup ``W``, decay start ``S`` and length ``L``:

    lr(s) = r * (s + 1) / W                       if s < W
    lr(s) = r * ((S + L - s) / L) ** 2            if S <= s < S + L   (decay; needs L > 0)
    lr(s) = 0                                     if s >= S + L and L > 0
    lr(s) = r                                     otherwise

Reference: NVIDIA DeepLearningExamples, DLRM "LearningRateScheduler" (warmup, then poly decay).
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class LearningRateSchedule:
    base: float
    warmup_steps: int = 0
    decay_start_step: int = 0
    decay_steps: int = 0

    def __post_init__(self):
        for name in ("warmup_steps", "decay_start_step", "decay_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"Expected {name} >= 0. Received: {name}={getattr(self, name)}")
        if self.base <= 0:
            raise ValueError(f"Expected a positive learning rate. Received: learning_rate={self.base}")
        if self.decay_steps and self.decay_start_step < self.warmup_steps:
            raise ValueError(
                "The decay must start after the warmup. Received: "
                f"warmup_steps={self.warmup_steps}, decay_start_step={self.decay_start_step}"
            )

    def __call__(self, step: int) -> float:
        """The rate at ``step`` (plain Python, for tests and logs)."""
        if step < self.warmup_steps:
            return self.base * (step + 1) / self.warmup_steps
        if self.decay_steps and step >= self.decay_start_step:
            remaining = max(0, self.decay_start_step + self.decay_steps - step)
            return self.base * (remaining / self.decay_steps) ** 2
        return self.base

    def tensor(self, step: tf.Tensor) -> tf.Tensor:
        """The same rate as a float32 tensor of an integer step tensor, for use inside tf.function."""
        s = tf.cast(step, tf.float32)
        rate = tf.constant(self.base, tf.float32)
        if self.warmup_steps:
            rate = tf.where(s < self.warmup_steps, self.base * (s + 1.0) / self.warmup_steps, rate)
        if self.decay_steps:
            remaining = tf.maximum(0.0, self.decay_start_step + self.decay_steps - s)
            decayed = self.base * tf.square(remaining / self.decay_steps)
            rate = tf.where(s >= max(self.decay_start_step, self.warmup_steps), decayed, rate)
        return rate
