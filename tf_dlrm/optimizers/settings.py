"""The optimizer settings of a run: the learning-rate schedule and the optimizers. Frozen, validated,
and free of TensorFlow so that parsing flags (``tf_dlrm.cli.flags``) imports none.

NVIDIA's DLRM learning-rate schedule: linear warmup, constant, then polynomial decay of power 2.
For step ``s`` (counted from 0), base rate ``r``, warmup ``W``, decay start ``S`` and length ``L``:

    lr(s) = r * (s + 1) / W                       if s < W
    lr(s) = r * ((S + L - s) / L) ** 2            if S <= s < S + L   (decay; needs L > 0)
    lr(s) = 0                                     if s >= S + L and L > 0
    lr(s) = r                                     otherwise

Reference: NVIDIA DeepLearningExamples, DLRM "LearningRateScheduler" (warmup, then poly decay).

Optimizers come in two families, each with its own base rate on the one schedule: embeddings
(a sparse optimizer of :mod:`tf_dlrm.optimizers`) and dense weights (the MLPs); see
:mod:`tf_dlrm.optimizers.config`, which makes them.
"""

from __future__ import annotations

import dataclasses

OPTIMIZERS = ("sgd", "adam", "adagrad", "lamb")
EMBEDDING_OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad", "lazy_adam", "ftrl", "catch_up_adam", "dense_adam")


def check_adam_arguments(beta_1: float, beta_2: float, epsilon: float) -> None:
    """The arguments of Adam, lazy Adam and LAMB."""
    for name, value in (("beta_1", beta_1), ("beta_2", beta_2)):
        if not 0.0 <= value < 1.0:
            raise ValueError(f"Expected 0 <= {name} < 1. Received: {name}={value}")
    if epsilon <= 0:
        raise ValueError(f"Expected epsilon > 0. Received: epsilon={epsilon}")


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

    def tensor(self, step):
        """The same rate as a float32 tensor of an integer step tensor, for use inside tf.function."""
        # Imported on use: this module is read while parsing flags, before TensorFlow may start.
        import tensorflow as tf

        s = tf.cast(step, tf.float32)
        rate = tf.constant(self.base, tf.float32)
        if self.warmup_steps:
            rate = tf.where(s < self.warmup_steps, self.base * (s + 1.0) / self.warmup_steps, rate)
        if self.decay_steps:
            remaining = tf.maximum(0.0, self.decay_start_step + self.decay_steps - s)
            decayed = self.base * tf.square(remaining / self.decay_steps)
            rate = tf.where(s >= max(self.decay_start_step, self.warmup_steps), decayed, rate)
        return rate


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """``loss_scale``: float16 only (ignored for float32 and bfloat16): a static scale, or 0 for
    dynamic loss scaling (see :class:`tf_dlrm.embedding.training_step.LossScale`). Rates of 0 mean the
    schedule's base. Weight decays are L2 coefficients: added to the gradient of the touched
    embedding rows, and to the MLPs' gradients (LAMB: inside its trust ratio instead)."""

    schedule: LearningRateSchedule
    optimizer: str = "sgd"
    loss_scale: float = 1.0
    dense_learning_rate: float = 0.0
    embedding_optimizer: str = "sgd"
    embedding_learning_rate: float = 0.0
    adagrad_initial_accumulator: float = 0.1
    adagrad_epsilon: float = 1e-7
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    embedding_weight_decay: float = 0.0
    dense_weight_decay: float = 0.0

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"Expected --optimizer in {OPTIMIZERS}. Received: optimizer={self.optimizer!r}")
        if self.embedding_optimizer not in EMBEDDING_OPTIMIZERS:
            raise ValueError(f"Expected --embedding_optimizer in {EMBEDDING_OPTIMIZERS}. "
                             f"Received: embedding_optimizer={self.embedding_optimizer!r}")
        if self.loss_scale < 0:
            raise ValueError(f"Expected a loss scale >= 0 (0: dynamic). Received: loss_scale={self.loss_scale}")
        for name in ("dense_learning_rate", "embedding_learning_rate", "embedding_weight_decay", "dense_weight_decay",
                     "adagrad_initial_accumulator", "adagrad_epsilon"):
            if getattr(self, name) < 0:
                raise ValueError(f"Expected --{name} >= 0. Received: {name}={getattr(self, name)}")
        # Checked here, before any work: building a Keras optimizer would start TensorFlow's runtime
        # before main.py sets its thread counts.
        try:
            check_adam_arguments(self.adam_beta1, self.adam_beta2, self.adam_epsilon)
        except ValueError as error:
            raise ValueError(f"{error} (flags --adam_beta1, --adam_beta2, --adam_epsilon)") from None

    @property
    def dense_rate_factor(self) -> float:
        """The MLPs' rate over the schedule's, at every step."""
        return self.dense_learning_rate / self.schedule.base if self.dense_learning_rate else 1.0

    @property
    def embedding_rate_factor(self) -> float:
        """The embeddings' rate over the schedule's, at every step."""
        return self.embedding_learning_rate / self.schedule.base if self.embedding_learning_rate else 1.0

    def record(self) -> dict:
        """The settings as plain data (checkpoint manifests, logs)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "schedule"}
        schedule = {k: getattr(self.schedule, k) for k in ("base", "warmup_steps", "decay_start_step", "decay_steps")}
        return {"name": self.optimizer, "schedule": schedule, **fields}
