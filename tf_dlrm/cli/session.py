"""Flag-free pieces of starting a run on this rank, shared by training and the other modes.

Kept apart from :mod:`tf_dlrm.cli.main` (which defines the absl flags) so that the modes use them
without importing the command line, and the command line imports the modes without a cycle.
"""

from __future__ import annotations

import os

from tf_dlrm.io import files


def configure_threads(config, local_size: int) -> tuple[int, int]:
    """Ranks on one machine share its cores: by default each gets cores / local ranks intra-op
    threads (the matmuls), and two inter-op threads, so that independent ops (the bottom MLP and
    the embedding exchange, the backward pass and the gradient allreduces) overlap, which one
    inter-op thread would run one after another.

    Also chooses the CPU allocator (:mod:`tf_dlrm.cli.cpu_allocator`): both must precede the
    process's first tensor."""
    import tensorflow as tf

    from tf_dlrm.cli import cpu_allocator

    cpu_allocator.choose()

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    intra = config.intra_op_parallelism or max(1, cores // max(1, local_size))
    inter = config.inter_op_parallelism or 2
    tf.config.threading.set_intra_op_parallelism_threads(intra)
    tf.config.threading.set_inter_op_parallelism_threads(inter)
    return intra, inter


def resolve_spec_path(config) -> str:
    if files.is_absolute(config.feature_spec) or not config.dataset_path:
        return config.feature_spec
    return files.join(config.dataset_path, config.feature_spec)


def report_precision(reporter, config, choice) -> None:
    """One line (and one JSON event) when ``--amp`` runs emulated here or fell back to float32."""
    if choice.notice:
        reporter.say(f"notice: {choice.notice}")
        reporter.event("notice", flag=f"--amp={config.amp.value}", precision=choice.policy, message=choice.notice)
