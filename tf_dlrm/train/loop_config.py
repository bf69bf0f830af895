"""The training loop's settings: how long, how often to evaluate and print, when to stop early. Frozen,
validated, and free of TensorFlow (flags parse into it)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    epochs: float = 1.0
    max_steps: int = -1  # -1: no limit
    evals_per_epoch: int = 1
    auc_threshold: float | None = None
    print_freq: int = 100
    eval_every_steps: int = 0  # > 0: evaluate every this many steps instead of evals_per_epoch times an epoch
    eval_max_batches: int = 0  # > 0: evaluate only the first this many global batches of the split
    early_stopping_patience: int = 0  # > 0: stop after this many evaluations without improvement
    early_stopping_min_delta: float = 0.0
    early_stopping_metric: str = "auc"  # what early stopping and keep_best choose by: "auc" (up) or "logloss" (down)

    def __post_init__(self):
        if self.epochs <= 0:
            raise ValueError(f"Expected epochs > 0. Received: epochs={self.epochs}")
        if self.evals_per_epoch < 0:
            raise ValueError(f"Expected evals_per_epoch >= 0. Received: evals_per_epoch={self.evals_per_epoch}")
        if self.print_freq <= 0:
            raise ValueError(f"Expected print_freq > 0. Received: print_freq={self.print_freq}")
        for name in ("eval_every_steps", "eval_max_batches", "early_stopping_patience"):
            if getattr(self, name) < 0:
                raise ValueError(f"Expected {name} >= 0. Received: {name}={getattr(self, name)}")
        if self.early_stopping_min_delta < 0:
            raise ValueError(f"Expected early_stopping_min_delta >= 0. Received: early_stopping_min_delta={self.early_stopping_min_delta}")
        if self.early_stopping_metric not in ("auc", "logloss"):
            raise ValueError(f"Expected early_stopping_metric in ('auc', 'logloss'). Received: early_stopping_metric="
                             f"{self.early_stopping_metric!r}")
        if self.eval_every_steps and self.evals_per_epoch:
            raise ValueError(f"Expected one of evals_per_epoch and eval_every_steps. Received: evals_per_epoch="
                             f"{self.evals_per_epoch}, eval_every_steps={self.eval_every_steps}")
