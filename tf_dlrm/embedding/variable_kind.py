"""How a variable is trained, marked on the variable itself (as Merlin's ``de_local``).

The layer that creates a weight knows how it is distributed; the trainer does not need to know the
model's attributes. Any model whose layers mark their variables trains with
:class:`tf_dlrm.train.step.Trainer`, which walks ``model.trainable_variables`` and sorts them by mark:

- ``sharded``: an embedding shard held by this rank only (model-parallel); its gradient arrives as
  ``IndexedSlices`` summed over ranks by the exchange's backward, and a sparse optimizer updates
  the touched rows;
- ``replicated``: an embedding table held whole by every rank (data-parallel); its gradient is
  averaged over ranks, then the same sparse optimizer updates the rows touched in the global batch;
- ``dense``: everything else (MLPs): gradient averaged over ranks, dense optimizer. An unmarked
  trainable variable is dense;
- ``hot``: the replicated hot rows of a model-parallel table (every rank, every column); its
  gradient is combined over ranks sparsely (touched rows only), then the sparse optimizer updates
  those rows identically everywhere (:mod:`tf_dlrm.embedding.hot_row_exchange`);
- ``padding``: a non-trainable variable that a rank owning no slice differentiates only to keep
  its backward collectives alive (never updated);
- ``split_low``: the lower 16 bits of a split bfloat16 table (``--split_embedding_tables``), the
  partner of a ``sharded`` bf16 variable that carries it (:mod:`tf_dlrm.embedding.split_tables`);
  non-trainable, written only by the sparse update of its partner.
"""

from __future__ import annotations

import enum


class VariableKind(str, enum.Enum):
    SHARDED = "sharded"
    REPLICATED = "replicated"
    DENSE = "dense"
    PADDING = "padding"
    HOT = "hot"
    SPLIT_LOW = "split_low"


_ATTRIBUTE = "tf_dlrm_kind"


def mark(variable, kind: VariableKind | str):
    """Sets ``variable``'s kind; returns it (so ``mark(self.add_weight(...), ...)`` reads as one line)."""
    setattr(variable, _ATTRIBUTE, VariableKind(kind))
    return variable


def kind_of(variable) -> VariableKind:
    """The mark of ``variable``; unmarked variables are dense."""
    return getattr(variable, _ATTRIBUTE, VariableKind.DENSE)


def variables_of_kind(variables, kind: VariableKind | str) -> list:
    kind = VariableKind(kind)
    return [v for v in variables if kind_of(v) is kind]


class SliceLayout:
    """What the rows of an embedding variable hold, for optimizers whose state spans a whole row.

    A fused embedding variable stacks slices (each a table's columns ``[start, end)``) at row
    offsets; a lookup gathers all of them at once, so a gradient's entries come in ``[batch, slices]``
    order. ``split_tables`` lists, the same on every rank, the tables whose columns are cut over
    several slices: row-wise state of those needs the squared-gradient sums of all slices of a row.

    Args:
        tables: the table of each slice, in fused (lookup) order.
        columns: ``(start, end)`` columns of each slice.
        dims: the full width of each slice's table.
        split_tables: the plan's column-sliced tables (every rank).
        row_offsets: the first fused row of each slice.
        row_wise_problem: set when row-wise state could not be kept exact (a column-sliced table
            read by a multi-hot feature or by several features): row-wise optimizers refuse it.
    """

    def __init__(self, tables, columns, dims, split_tables=(), row_offsets=None, row_wise_problem=None):
        self.tables = tuple(int(t) for t in tables)
        self.columns = tuple((int(a), int(b)) for a, b in columns)
        self.dims = tuple(int(d) for d in dims)
        self.split_tables = tuple(int(t) for t in split_tables)
        # First fused row of each slice (default: one slice at row 0), to find a row's slice.
        self.row_offsets = tuple(int(o) for o in (row_offsets if row_offsets is not None else [0] * len(self.tables)))
        # Why row-wise optimizer state cannot be kept exact for this variable, or None.
        self.row_wise_problem = row_wise_problem
        if not len(self.tables) == len(self.columns) == len(self.dims):
            raise ValueError(f"Expected one table, column range and dim per slice. Received: tables={self.tables}, "
                             f"columns={self.columns}, dims={self.dims}")


def set_layout(variable, layout: SliceLayout):
    variable.tf_dlrm_layout = layout
    return variable


def layout_of(variable) -> SliceLayout | None:
    return getattr(variable, "tf_dlrm_layout", None)
