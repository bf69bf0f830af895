"""TensorFlow's CPU allocator for training: its BFC pool, unless the environment chooses.

TensorFlow's default CPU allocator passes every tensor to malloc, and glibc serves the large ones
(above its mmap threshold, 32 MiB at most) with fresh pages from the kernel and returns them when
the tensor dies: every step then page-faults its big activations and exchange buffers in again,
and a rank spends a large share of its CPU time in the kernel. TensorFlow's BFC allocator keeps
freed blocks for reuse, so a step's buffers are faulted in once (benchmarks/results/performance.md, *The CPU allocator*, has
the measurements).

TensorFlow reads ``TF_CPU_ALLOCATOR_USE_BFC`` when it creates the allocator, at the process's first
tensor: :func:`choose` must run before that (``configure_threads`` calls it). A value the user set
wins: ``TF_CPU_ALLOCATOR_USE_BFC=false`` gives malloc back.
"""

from __future__ import annotations

import os

VARIABLE = "TF_CPU_ALLOCATOR_USE_BFC"


def choose() -> bool:
    """Makes the BFC pool this process's default; returns whether it is in use."""
    os.environ.setdefault(VARIABLE, "true")
    return pooled()


def pooled() -> bool:
    # TensorFlow's ReadBoolFromEnvVar: "true"/"1" and "false"/"0", case-insensitive.
    return os.environ.get(VARIABLE, "").strip().lower() in ("true", "1")


def describe() -> str:
    """One line for the run's log."""
    if pooled():
        return f"CPU allocator: TensorFlow's BFC pool ({VARIABLE}={os.environ[VARIABLE]}; =false for malloc)"
    return f"CPU allocator: malloc ({VARIABLE}={os.environ.get(VARIABLE, '')!r})"
