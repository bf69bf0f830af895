"""The interface of the sparse embedding optimizers and the steps they share.

An embedding variable ``[rows, width]`` (a fused shard, a replicated table, or a plain table) gets
its gradient as ``IndexedSlices`` with one entry per looked-up id, repeated ids included. Before
any stateful update the repeated ids are summed (:func:`deduplicate`): one process sees the summed
row gradient, and so must each rank, or Adagrad and Adam would count a row's step twice. Then
:meth:`SparseOptimizer.apply` reads and writes the rows touched in this step only; the state of
untouched rows (and the rows themselves) never change, which is the "lazy" semantics of sparse
optimizers (TF's LazyAdam, TorchRec, HugeCTR).

State lives next to its shard: a state variable is ``[rows, width]`` like the variable (per-element
state, so a column slice holds its columns' state), or ``[rows, 1]`` for row-wise state (every
slice of a row holds a copy of that row's value, kept equal; see
:mod:`tf_dlrm.optimizers.rowwise_adagrad`). State is float32 whatever the compute precision.
"""

from __future__ import annotations

import tensorflow as tf

from tf_dlrm.ops import kernels


def deduplicate(gradient: tf.IndexedSlices):
    """``(unique rows [U], summed gradient [U, width], position [n] of each entry in unique)``.

    The rows in order of first occurrence, each row's values added in their order from zero: with
    tf_dlrm's kernel library one multi-threaded op (``tf_dlrm/ops/deduplicate.cc``), else
    ``tf.unique`` and ``tf.math.unsorted_segment_sum``, the same bits either way."""
    library = kernels()
    if library is not None and gradient.values.dtype == tf.float32 and gradient.values.shape.rank == 2:
        return library.tf_dlrm_deduplicate(indices=gradient.indices, values=gradient.values)
    unique, position = tf.unique(gradient.indices)
    summed = tf.math.unsorted_segment_sum(gradient.values, position, tf.shape(unique)[0])
    return unique, summed, position


class SparseOptimizer:
    """Updates the touched rows of embedding variables.

    Subclasses set ``name`` and ``slots`` (``{slot name: initial value}``), and ``row_wise`` when
    their state is one value per row; they implement :meth:`apply`.
    """

    name = ""
    slots: dict[str, float] = {}
    row_wise = False
    # Whether the optimizer updates every row each step and takes the L2 decay itself, for every row
    # (``apply(..., weight_decay=)``); otherwise the caller adds it to the touched rows' gradient.
    decays_every_row = False

    def create_slots(self, variable) -> dict[str, tf.Variable]:
        """The state variables of ``variable``, shaped like it (``[rows, 1]`` if row-wise)."""
        rows, width = variable.shape
        shape = (rows, 1) if self.row_wise else (rows, width)
        base = variable.path.replace("/", "_") if hasattr(variable, "path") else variable.name
        return {
            slot: tf.Variable(tf.fill(shape, tf.constant(initial, tf.float32)), trainable=False, name=f"{base}_{slot}")
            for slot, initial in self.slots.items()
        }

    def apply(self, variable, slots, rows, gradient, learning_rate, step, row_mean_squares=None) -> None:
        """Updates ``variable[rows]`` (and its ``slots``) from the summed ``gradient [U, width]``.

        Args:
            variable: a Keras or tf variable ``[R, width]`` (float32).
            slots: its state, from :meth:`create_slots`.
            rows: unique touched rows ``[U]``.
            gradient: the summed gradient of each touched row ``[U, width]``, float32.
            learning_rate: scalar tensor.
            step: the 1-based count of this update (Adam's bias correction).
            row_mean_squares: row-wise optimizers only: the mean squared gradient over the *whole*
                row ``[U]`` (all column slices of the row, wherever they live).
        """
        raise NotImplementedError


def tf_variable(variable) -> tf.Variable:
    """The ``tf.Variable`` under a Keras 3 variable (or the variable itself): scatter ops and
    gathers on it touch only the rows asked for, never a copy of the whole table."""
    return variable if isinstance(variable, tf.Variable) else variable.value


def gather(variable, rows: tf.Tensor) -> tf.Tensor:
    return tf.gather(tf_variable(variable), rows)


def scatter_sub(variable, rows: tf.Tensor, values: tf.Tensor) -> None:
    """``variable[rows] -= values`` for distinct ``rows`` (what :meth:`SparseOptimizer.apply` is given).

    Written as a gather, a subtraction and a ``scatter_update``: the same float32 operation on each
    element as ``scatter_sub``, so the same bits, but TensorFlow 2.21's arithmetic scatters
    (``scatter_sub``/``scatter_add``) run several times slower than its ``scatter_update``
    (benchmarks/sparse_ops.py). With repeated rows it would drop all but one update: callers pass the
    rows of :func:`deduplicate`."""
    target = tf_variable(variable)
    target.scatter_update(tf.IndexedSlices(tf.gather(target, rows) - values, rows))


def scatter_update(variable, rows: tf.Tensor, values: tf.Tensor) -> None:
    tf_variable(variable).scatter_update(tf.IndexedSlices(values, rows))
