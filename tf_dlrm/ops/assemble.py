"""The embedding layer's output assembled in one copy (``tf_dlrm/ops/assemble_columns.cc``).

After the exchange a rank holds what every source sent (one flat tensor: source s's ``[b, W_s]``
block after source s-1's) and the ``[b, R]`` lookups of its replicated tables. The layer's output
is their columns in feature order. Without the kernel that is split + concat, concat and a column
permutation: three copies of every row forward and four backward, each a pass over memory as long
as the lookups themselves (benchmarks/results/performance.md, "Where a -np 2 step's time goes", has the timings).
:func:`assemble_columns` writes each output row once from where its columns lie, and its gradient
writes each part's gradient once, in the part's own shape (the flat one goes straight back into the
alltoall's gradient).

:func:`assembly_layout` is pure Python: it turns the layer's permutation over the joined columns
into runs of consecutive columns of one chunk.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

from tf_dlrm.ops import kernels


def assemble_kernel():
    """The kernel library when it has the assembly ops, else None."""
    library = kernels()
    return library if library is not None and hasattr(library, "tf_dlrm_assemble_columns") else None


def assembly_layout(part_chunk_widths: Sequence[Sequence[int]], permutation: Sequence[int]) -> dict:
    """The op's attributes for parts made of chunks of ``part_chunk_widths`` (part p: its chunks'
    widths, stacked along the rows), whose columns side by side (all chunks of part 0, then part 1, ...)
    are the "joined" columns that ``permutation`` picks from: output column j is joined column
    ``permutation[j]``. Joined columns the permutation skips (padding) get a zero gradient."""
    chunk_widths = [int(w) for widths in part_chunk_widths for w in widths]
    if not chunk_widths or any(w < 0 for w in chunk_widths) or any(sum(widths) < 1 for widths in part_chunk_widths):
        raise ValueError(f"Expected parts of chunks with at least one column each. Received: {part_chunk_widths}")
    starts = np.concatenate([[0], np.cumsum(chunk_widths)])
    permutation = np.asarray(permutation, dtype=np.int64)
    if permutation.size and (permutation.min() < 0 or permutation.max() >= starts[-1]):
        raise ValueError(f"The permutation reads joined columns outside [0, {int(starts[-1])}): "
                         f"min {int(permutation.min())}, max {int(permutation.max())}")
    if len(np.unique(permutation)) != len(permutation):
        raise ValueError("The permutation reads a joined column twice; its gradient would be a sum")
    chunk_of = np.searchsorted(starts, permutation, side="right") - 1
    runs = []  # [chunk, first column, length]
    for joined, chunk in zip(permutation.tolist(), chunk_of.tolist()):
        column = joined - int(starts[chunk])
        if runs and runs[-1][0] == chunk and runs[-1][1] + runs[-1][2] == column:
            runs[-1][2] += 1
        else:
            runs.append([chunk, column, 1])
    return {
        "chunk_widths": chunk_widths,
        "chunks_per_part": [len(widths) for widths in part_chunk_widths],
        "run_chunks": [r[0] for r in runs],
        "run_columns": [r[1] for r in runs],
        "run_lengths": [r[2] for r in runs],
    }


def assemble_columns(parts: Sequence[tf.Tensor], layout: dict) -> tf.Tensor:
    """``[b, len(permutation)]``: the columns :func:`assembly_layout` describes, from ``parts``
    (each flat ``[b * its width]`` or ``[b, its width]``, all of one dtype), in one op."""
    library = assemble_kernel()
    if library is None:
        raise RuntimeError("tf_dlrm's assembly kernel is not loaded (python -m tf_dlrm.ops.build)")
    return library.tf_dlrm_assemble_columns(parts=list(parts), **layout)


@tf.RegisterGradient("TfDlrmAssembleColumns")
def _assemble_gradient(op, upstream):
    names = ("chunk_widths", "chunks_per_part", "run_chunks", "run_columns", "run_lengths")
    layout = {name: op.get_attr(name) for name in names}
    ranks = [part.shape.rank for part in op.inputs]
    if any(rank not in (1, 2) for rank in ranks):
        raise ValueError(f"TfDlrmAssembleColumns: every part must be of rank 1 or 2. Received ranks {ranks}")
    return list(assemble_kernel().tf_dlrm_assemble_columns_grad(gradient=upstream, part_ranks=ranks, N=len(ranks), **layout))
