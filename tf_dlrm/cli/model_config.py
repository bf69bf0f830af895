"""The model and sharding settings of a run: frozen, and validated when made from the flags."""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from tf_dlrm.embedding.table_init import check_init_bound
from tf_dlrm.models.config import ModelFamilyConfig
from tf_dlrm.sharding.plan import Strategy

# The values of tf_dlrm.models.layers.interaction.InteractionKind, copied here so that the choices read as
# plain strings beside the other flags' values; tests/config/test_config_tf_free.py checks that the two agree.
INTERACTIONS = ("dot", "cat")
# Keras's Embedding draws from [-0.05, 0.05]; see the README's "Model quality" for the measurement
# that made it the default over the DLRM reference's 1/sqrt(rows).
DEFAULT_EMBEDDING_INIT_BOUND = 0.05


def parse_positive_or(text: str, keyword: str, flag: str, meaning: str) -> float | None:
    """A flag that is ``keyword`` (None) or a positive finite number; raises naming the flag."""
    text = str(text).strip()
    if text == keyword:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise ValueError(f"Expected {flag} to be {keyword} or a positive number ({meaning}). Received: {flag}={text!r}")
    return value


def parse_embedding_init(text: str) -> float | None:
    """``--embedding_init``: ``sqrt_rows`` (None) or a positive bound."""
    return parse_positive_or(text, "sqrt_rows", "--embedding_init", "the bound b of uniform [-b, b]")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    embedding_dim: int = 128
    bottom_mlp_dims: tuple[int, ...] = (512, 256, 128)
    top_mlp_dims: tuple[int, ...] = (1024, 1024, 512, 256, 1)
    interaction: str = "dot"
    include_diagonal: bool = False
    # Per-table widths overriding embedding_dim and the spec's own: ((table name, width), ...).
    embedding_dims: tuple[tuple[str, int], ...] = ()
    # --model and the hyper-parameters of DCNv2, DeepFM and Wide & Deep (tf_dlrm.models.config).
    family: ModelFamilyConfig = ModelFamilyConfig()
    # --embedding_init: initial table values uniform in [-b, b]; None: b = 1/sqrt(rows) (the DLRM reference).
    embedding_init_bound: float | None = DEFAULT_EMBEDDING_INIT_BOUND

    def __post_init__(self):
        if self.embedding_dim <= 0:
            raise ValueError(f"Expected --embedding_dim > 0. Received: embedding_dim={self.embedding_dim}")
        for name in ("bottom_mlp_dims", "top_mlp_dims"):
            dims = getattr(self, name)
            if not dims or any(d <= 0 for d in dims):
                raise ValueError(f"Expected --{name} to be positive widths. Received: {name}={list(dims)}")
        if self.top_mlp_dims[-1] != 1:
            raise ValueError(f"Expected --top_mlp_dims to end with 1 (the logit). Received: {list(self.top_mlp_dims)}")
        check_init_bound(self.embedding_init_bound, "--embedding_init")
        if self.interaction not in INTERACTIONS:
            raise ValueError(f"Expected --interaction in {list(INTERACTIONS)}. Received: {self.interaction!r}")
        if self.family.model == "dlrm" and self.interaction == "dot" and self.bottom_mlp_dims[-1] != self.embedding_dim:
            raise ValueError(
                "The dot interaction needs the bottom MLP's last width to equal the embedding dim. "
                f"Received: --bottom_mlp_dims={','.join(map(str, self.bottom_mlp_dims))}, --embedding_dim={self.embedding_dim}"
            )


@dataclasses.dataclass(frozen=True)
class ShardingConfig:
    strategy: str = Strategy.AUTO.value
    data_parallel_threshold: int = 2048
    column_slice_threshold: int | None = None
    data_parallel_input: bool = False
    deduplicate_exchange: bool = False
    hot_rows_budget: float = 0.0
    hot_rows_min_per_step: float = 0.0
    memory_per_rank: int = 0  # bytes of tables + optimizer state + hot rows a rank may hold; 0: no limit
    # --hot_row_sync_every: merge the hot-row replicas every this many steps (1: combined every step).
    hot_row_sync_every: int = 1
    # Model-parallel tables stored as split bfloat16 halves (tf_dlrm.embedding.split_tables).
    split_embedding_tables: bool = False

    def __post_init__(self):
        if not 0.0 <= self.hot_rows_budget <= 1.0:
            raise ValueError(f"Expected 0 <= --hot_rows_budget <= 1 (a fraction of the model-parallel tables' memory). "
                             f"Received: --hot_rows_budget={self.hot_rows_budget}")
        if self.hot_rows_min_per_step < 0:
            raise ValueError(f"Expected --hot_rows_min_per_step >= 0. Received: {self.hot_rows_min_per_step}")
        if not isinstance(self.memory_per_rank, int) or self.memory_per_rank < 0:
            raise ValueError(f"Expected --memory_per_rank >= 0 bytes. Received: {self.memory_per_rank!r}")
        every = self.hot_row_sync_every
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"Expected --hot_row_sync_every >= 1 (an integer number of steps). Received: --hot_row_sync_every={every!r}")
        if every > 1 and not self.hot_rows_budget:
            raise ValueError(f"--hot_row_sync_every={every} lets hot-row replicas drift between merges: it needs "
                             f"--hot_rows_budget > 0. Received: --hot_rows_budget={self.hot_rows_budget}")


def parse_dims(text: str | Sequence[int], flag: str) -> tuple[int, ...]:
    """``"512,256,128"`` (or a sequence of ints) -> ``(512, 256, 128)``; a ValueError names ``--flag``."""
    if not isinstance(text, str):
        return tuple(int(x) for x in text)
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"Expected --{flag} as comma-separated integers, e.g. 512,256,128. Received: {text!r}") from None
