"""Which sparse optimizer trains which embedding table: the embedding optimizer, or a per-table one.

Wide & Deep trains its wide tables with their own optimizer (``--wide_optimizer``). Tables live in
fused variables (one per slice width), and the planner may cut a deep table into slices as narrow
as a wide table's, so one fused variable can hold rows of tables trained by different optimizers:
such a variable keeps the state of each optimizer it needs (shaped like the variable; the rows of
other tables' optimizers are never read) and each step splits its touched rows by table.
"""

from __future__ import annotations

import numpy as np

from tf_dlrm.model.variable_kind import layout_of
from tf_dlrm.optimizers.sparse_optimizer import SparseOptimizer


class TableOptimizers:
    """Args:
        optimizer: the embedding optimizer (group 0).
        overrides: ``{table index: (optimizer, rate scale)}``, the same on every rank; the scale
            multiplies the embedding rate.
    """

    def __init__(self, optimizer: SparseOptimizer, overrides=None):
        overrides = dict(overrides or {})
        if any(o.row_wise for o, _ in overrides.values()):
            raise ValueError("A row-wise optimizer can only be the embedding optimizer, not a per-table one")
        self.choices = [(optimizer, 1.0)]
        for choice in overrides.values():
            if choice not in self.choices:
                self.choices.append(choice)
        self.group_of = {table: self.choices.index(choice) for table, choice in overrides.items()}

    @property
    def overridden(self) -> bool:
        return len(self.choices) > 1

    def group_of_table(self, table: int) -> int:
        return self.group_of.get(table, 0)

    def table_optimizer(self, table: int) -> SparseOptimizer:
        return self.choices[self.group_of_table(table)][0]

    def slice_groups(self, variable) -> np.ndarray:
        """The group of each slice of a fused variable (one slice, group 0, without a layout)."""
        layout = layout_of(variable)
        if layout is None or not layout.tables:
            return np.zeros(1, np.int32)
        return np.array([self.group_of_table(t) for t in layout.tables], np.int32)

    def state_entries(self, num_tables: int) -> list[tuple[str, int]]:
        """``(slot, table)`` of every piece of state, in one order on every rank: the embedding
        optimizer's slots table by table, then the per-table optimizers' own."""
        main = self.choices[0][0]
        entries = [(slot, t) for slot in main.slots for t in range(num_tables) if self.group_of_table(t) == 0]
        extra = sorted({slot for o, _ in self.choices[1:] for slot in o.slots})
        entries += [(slot, t) for slot in extra for t in sorted(self.group_of) if slot in self.table_optimizer(t).slots]
        return entries
