"""Where each feature's pooled columns travel in the embedding exchange: pure Python, no TensorFlow.

Rank r keeps its model-parallel slices in one fused variable per width (``packing_groups``). Every
feature reading a table of a slice adds one *entry* (feature, slice) to the rank's send block:
``[local batch, sum of entry widths]`` per destination, entries in packing order (group by group,
slices in plan order, the features of a slice in feature order). A multi-hot feature is pooled
before it is sent, so it adds exactly the columns of a one-hot one.

A row-sliced table's bands each send the pooled sum of the ids that fall in their rows (a partial
vector of the table's full width, or of its band's column slice); the receiver adds the bands'
vectors (:func:`band_permutations`), so each band costs the exchange columns of a whole table.
"""

from __future__ import annotations

from collections.abc import Sequence

from tf_dlrm.sharding.plan import TableSlice, ShardingPlan


def packing_groups(plan: ShardingPlan, rank: int) -> list[tuple[int, list[TableSlice]]]:
    """This rank's slices grouped by width (widest first), plan order within a group."""
    return [(width, [s for s in plan.rank_slices[rank] if s.width == width])
            for width in sorted({s.width for s in plan.rank_slices[rank]}, reverse=True)]


def replicated_groups(plan: ShardingPlan) -> list[tuple[int, list[TableSlice]]]:
    """The replicated tables as whole-table slices grouped by width (widest first), table order."""
    slices = [TableSlice(t, 0, plan.tables[t].dim) for t in plan.replicated]
    return [(width, [s for s in slices if s.width == width])
            for width in sorted({s.width for s in slices}, reverse=True)]


def group_entries(slices: Sequence[TableSlice], feature_tables: Sequence[int]) -> list[tuple[int, int]]:
    """``(feature, position of its slice in the group)`` for every feature reading a slice's table."""
    return [(feature, position) for position, piece in enumerate(slices)
            for feature, table in enumerate(feature_tables) if table == piece.table]


def send_width(plan: ShardingPlan, rank: int, feature_tables: Sequence[int]) -> int:
    """Columns rank ``rank`` sends per sample: the widths of all its entries."""
    return sum(slices[position].width for _, slices in packing_groups(plan, rank)
               for _, position in group_entries(slices, feature_tables))


def received_labels(plan: ShardingPlan, feature_tables: Sequence[int]) -> list:
    """``(feature, column, band)`` of every column of the received ``[b, sum_s W_s]`` block, by source rank
    (``band``: the first row of the slice's row band, 0 for a table that is not row-sliced).

    A rank with nothing to send still sends one column of zeros (Horovod's alltoall hangs when a
    rank sends zero elements), labelled ``("padding", rank)``.
    """
    labels = []
    for rank in range(plan.world_size):
        before = len(labels)
        for _, slices in packing_groups(plan, rank):
            for feature, position in group_entries(slices, feature_tables):
                piece = slices[position]
                labels.extend((feature, column, piece.row_start) for column in range(piece.column_start, piece.column_end))
        if len(labels) == before and plan.world_size > 1:
            labels.append(("padding", rank))
    return labels


def replicated_labels(plan: ShardingPlan, feature_tables: Sequence[int]) -> list:
    """``(feature, column, 0)`` of the columns of the replicated lookups, in their group order."""
    return [(feature, column, 0) for _, slices in replicated_groups(plan)
            for feature, position in group_entries(slices, feature_tables)
            for column in range(slices[position].column_start, slices[position].column_end)]


def output_permutation(plan: ShardingPlan, feature_tables: Sequence[int], labels: Sequence) -> list[int]:
    """Positions in ``labels`` that give every feature's columns ``0..width-1``, feature by feature (of
    a row-sliced table, its first band's)."""
    position = {label: index for index, label in enumerate(labels)}
    return [position[(feature, column, 0)] for feature, table in enumerate(feature_tables)
            for column in range(plan.tables[table].dim)]


def band_permutations(plan: ShardingPlan, feature_tables: Sequence[int], labels: Sequence) -> list[list[int]]:
    """For each further row band ``j = 1, 2, ...`` (up to the most bands of any table read): positions in
    ``labels`` that give every feature's columns from its table's band ``j``, in the order of
    :func:`output_permutation`, or ``len(labels)`` (a zero column appended by the caller) where the
    feature's table has fewer bands. The output is the sum of the permuted blocks; empty when no
    table read is row-sliced."""
    position = {label: index for index, label in enumerate(labels)}
    bands = {t: plan.row_bands(t) if t in set(plan.model_parallel) else ((0, plan.tables[t].rows),)
             for t in set(feature_tables)}
    most = max((len(b) for b in bands.values()), default=1)
    return [[position[(feature, column, bands[table][j][0])] if j < len(bands[table]) else len(labels)
             for feature, table in enumerate(feature_tables) for column in range(plan.tables[table].dim)]
            for j in range(1, most)]


def alltoall_bytes_per_step(plan: ShardingPlan, feature_tables: Sequence[int], global_batch_size: int,
                            bytes_per_value: int = 4) -> int:
    """Bytes the busiest rank sends to the others in one forward exchange of pooled embeddings:
    ``(N - 1) * local batch * max_r send_width(r) * bytes_per_value``; hotness does not enter."""
    if global_batch_size % plan.world_size:
        raise ValueError(f"Expected global_batch_size to be a multiple of world_size={plan.world_size}. "
                         f"Received: global_batch_size={global_batch_size}")
    widest = max(send_width(plan, rank, feature_tables) for rank in range(plan.world_size))
    return (plan.world_size - 1) * (global_batch_size // plan.world_size) * widest * bytes_per_value
