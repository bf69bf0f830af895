"""Where this process stands among the ranks, and the Horovod collectives tf_dlrm uses.

Nothing below ``main.py`` calls ``hvd.rank()``: the entry point builds one :class:`DistributedEnv`
and passes it down. With one rank no Horovod call is made at all, so single-process runs and tests
work without ``horovodrun``.
"""

from __future__ import annotations

import dataclasses
import os


@dataclasses.dataclass(frozen=True)
class DistributedEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_size: int = 1

    def __post_init__(self):
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"Expected 0 <= rank < world_size. Received: rank={self.rank}, world_size={self.world_size}")

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def launched_by_horovodrun() -> bool:
    return "HOROVOD_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ


def launched_world_size() -> int:
    """The world size the launcher gave this process, readable before ``hvd.init`` (1 without one)."""
    return int(os.environ.get("HOROVOD_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE") or 1)


def initialize(force_horovod: bool = False) -> DistributedEnv:
    """Initialises Horovod when this process was started by ``horovodrun`` (or when forced)."""
    if not (force_horovod or launched_by_horovodrun()):
        return DistributedEnv()
    import horovod.tensorflow as hvd

    hvd.init()
    return DistributedEnv(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())


def current_env() -> DistributedEnv:
    """This process's place: Horovod's ranks when Horovod is initialised, else one process (the
    default of layers built without an explicit env, e.g. in a user's own model)."""
    if not launched_by_horovodrun():
        return DistributedEnv()
    import horovod.tensorflow as hvd

    if not hvd.is_initialized():
        raise RuntimeError("This process was started by horovodrun: call tf_dlrm.parallel.env.initialize() "
                           "(or hvd.init()) before building a DistributedEmbedding")
    return DistributedEnv(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())
