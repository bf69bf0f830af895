"""The training loop's settings: how long, how often to evaluate and print. Frozen, validated, and free
of TensorFlow (flags parse into it)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    epochs: float = 1.0
    max_steps: int = -1  # -1: no limit
    evals_per_epoch: int = 1
    auc_threshold: float | None = None
    print_freq: int = 100

    def __post_init__(self):
        if self.epochs <= 0:
            raise ValueError(f"Expected epochs > 0. Received: epochs={self.epochs}")
        if self.evals_per_epoch < 0:
            raise ValueError(f"Expected evals_per_epoch >= 0. Received: evals_per_epoch={self.evals_per_epoch}")
        if self.print_freq <= 0:
            raise ValueError(f"Expected print_freq > 0. Received: print_freq={self.print_freq}")
