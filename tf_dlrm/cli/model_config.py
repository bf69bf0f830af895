"""The model and sharding settings of a run: frozen, and validated when made from the flags."""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from tf_dlrm.embedding.planning import DEFAULT_DATA_PARALLEL_ROWS
from tf_dlrm.embedding.table_config import DEFAULT_INIT_BOUND, FrequencyRegularizer
from tf_dlrm.embedding.table_init import check_init_bound
from tf_dlrm.sharding.plan import Strategy



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
    """Which model to build and its tables' widths and initialisation.

    Args:
        embedding_dim: width of every deep table (unless the spec or ``embedding_dims`` says).
        name: ``--model``: a registered model's name or an import path ``package.module:Class``
            (:mod:`tf_dlrm.models.registry`).
        params: the model's own hyper-parameters, an instance of its ``Config`` (None: its defaults).
        embedding_dims: per-table widths overriding ``embedding_dim``, ``embedding_widths`` and the spec's:
            ``((table, width), ...)``.
        embedding_widths: one width per categorical feature in spec order (NVIDIA's ``--embedding_dim``
            list), overriding the spec's and ``embedding_dim``; empty: none.
        embedding_init_bound: ``--embedding_init``: initial table values uniform in ``[-b, b]``;
            None: ``b = 1/sqrt(rows)`` (the DLRM reference).
        embedding_min_count: ``--embedding_min_count``: a row is updated from the step that has looked
            it up this many times (1: from the first); with ``embedding_frequency_l2``, every table's
            :class:`tf_dlrm.embedding.table_config.FrequencyRegularizer`.
        embedding_frequency_l2: ``--embedding_frequency_l2``: ``l2 * w / (count * global batch)`` added to each
            touched row's gradient.
    """

    embedding_dim: int = 128
    name: str = "dlrm"
    params: object = None
    embedding_dims: tuple[tuple[str, int], ...] = ()
    embedding_init_bound: float | None = DEFAULT_INIT_BOUND
    embedding_widths: tuple[int, ...] = ()
    embedding_min_count: int = 1
    embedding_frequency_l2: float = 0.0

    def __post_init__(self):
        if isinstance(self.embedding_dim, bool) or not isinstance(self.embedding_dim, int) or self.embedding_dim <= 0:
            raise ValueError(f"Expected --embedding_dim > 0. Received: embedding_dim={self.embedding_dim}")
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"Expected --model to name a model. Received: --model={self.name!r}")
        if self.params is not None and not dataclasses.is_dataclass(self.params):
            raise TypeError(f"Expected params to be a model's Config dataclass (or None). Received: {type(self.params).__name__}")
        check_init_bound(self.embedding_init_bound, "--embedding_init")
        if any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in self.embedding_widths):
            raise ValueError(f"Expected --embedding_dim widths > 0. Received: {list(self.embedding_widths)}")
        count = self.embedding_min_count
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"Expected --embedding_min_count >= 1 (steps that looked a row up before it is updated). "
                             f"Received: --embedding_min_count={count!r}")
        l2 = self.embedding_frequency_l2
        if isinstance(l2, bool) or not isinstance(l2, (int, float)) or not 0 <= l2 < math.inf:
            raise ValueError(f"Expected --embedding_frequency_l2 >= 0. Received: --embedding_frequency_l2={l2!r}")

    @property
    def frequency_regularizer(self) -> FrequencyRegularizer | None:
        """``--embedding_min_count`` and ``--embedding_frequency_l2`` as every table's regularizer (None: neither)."""
        regularizer = FrequencyRegularizer(l2=float(self.embedding_frequency_l2), min_count=self.embedding_min_count)
        return regularizer if regularizer.active else None

    @property
    def table_initializer(self):
        """``--embedding_init`` as a :class:`TableConfig` initializer (whose None is the library's default bound)."""
        return "uniform_sqrt_rows" if self.embedding_init_bound is None else self.embedding_init_bound


@dataclasses.dataclass(frozen=True)
class ShardingConfig:
    strategy: str = Strategy.AUTO.value
    data_parallel_threshold: int = DEFAULT_DATA_PARALLEL_ROWS  # rows (--data_parallel_rows)
    # NVIDIA's --data_parallel_threshold: tables of fewer elements (rows x width) are replicated too; None: no such rule.
    data_parallel_elements: int | None = None
    column_slice_threshold: int | None = None
    row_slice_threshold: int | None = None  # NVIDIA's: tables of more elements are cut into row bands over every rank
    data_parallel_input: bool = False
    deduplicate_exchange: bool = False
    hot_rows_budget: float = 0.0
    hot_rows_min_per_step: float = 0.0
    memory_per_rank: int = 0  # bytes of tables, hot rows, dense weights and all their optimizer state a rank may hold; 0: none
    # --hot_row_sync_every: merge the hot-row replicas every this many steps (1: combined every step).
    hot_row_sync_every: int = 1
    # Model-parallel tables stored as split bfloat16 halves (tf_dlrm.embedding.split_tables).
    split_embedding_tables: bool = False

    def __post_init__(self):
        if not 0.0 <= self.hot_rows_budget <= 1.0:
            raise ValueError(f"Expected 0 <= --hot_rows_budget <= 1 (a fraction of the model-parallel tables' memory). "
                             f"Received: --hot_rows_budget={self.hot_rows_budget}")
        if self.data_parallel_elements is not None and self.data_parallel_elements < 0:
            raise ValueError(f"Expected --data_parallel_threshold >= 0 elements. Received: --data_parallel_threshold={self.data_parallel_elements}")
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
