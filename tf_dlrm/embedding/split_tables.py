"""Split bfloat16 embedding tables: each float32 weight stored as its two 16-bit halves.

Intel's MLPerf DLRM trains bf16 models on CPU with a *split* optimizer: the 32 bits of every fp32
weight are kept as two 16-bit arrays,

- ``high``: the upper 16 bits, which read as a ``bfloat16`` **are** the weight truncated to bf16
  (sign, the 8 exponent bits and the top 7 mantissa bits), and
- ``low``: the lower 16 mantissa bits, as ``uint16``.

Forward lookups and the alltoall read ``high`` directly: half the bytes of a float32 gather and no
cast. The sparse update gathers both halves of the touched rows, puts them back together bit-exactly
(``bitcast((high << 16) | low)``), applies the embedding optimizer's usual float32 update and splits
the result again (:mod:`tf_dlrm.embedding.split_update`). The table costs 4 bytes per weight, as in
float32 training, with no master copy, and the update is exactly the float32 one; only the forward
sees bf16 (truncated, not rounded: ``high`` is a view of the weight, so it cannot be rounded).

The layer marks the ``high`` variable (trainable, ``sharded``) with its ``low`` partner
(:func:`mark_split`); everything that reads or writes whole rows in float32 (optimizers, checkpoints,
export, the equivalence tests) goes through :func:`read_float32` and :func:`write_float32`, which do
the plain thing for float32 variables.

Limits (:func:`check_split_options`, and ``train.builder`` for the model and dynamic tables): only
model-parallel shards are split (replicated tables are small, never exchanged, and their gradients join
the float32 allreduce); the compute dtype must be bfloat16 (``--amp``: a float32 model would round the
tables' gradients to bf16 through the cast); not with hot-row replicas or the deduplicated exchange
(their rows travel in float32); multi-hot rows are pooled in float32.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_dlrm.embedding.variable_kind import VariableKind, mark

_PARTNER = "tf_dlrm_split_low"
LOW_DTYPE = "uint16"


# ------------------------------------------------------------------ bits (numpy)


def split_array(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 ``values`` -> (upper 16 bits as uint16, lower 16 bits as uint16), same shape."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return (bits >> 16).astype(np.uint16), (bits & 0xFFFF).astype(np.uint16)


def join_arrays(high_bits: np.ndarray, low_bits: np.ndarray) -> np.ndarray:
    """The inverse of :func:`split_array`: float32 with exactly the original bits."""
    bits = (np.asarray(high_bits, np.uint16).astype(np.uint32) << 16) | np.asarray(low_bits, np.uint16).astype(np.uint32)
    return bits.view(np.float32)


# ------------------------------------------------------------------ bits (TensorFlow)


def split_tensor(values: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """float32 ``values`` -> (``bfloat16`` upper half, ``uint16`` lower half); bit-exact."""
    bits = tf.bitcast(tf.convert_to_tensor(values, tf.float32), tf.uint32)
    high = tf.bitcast(tf.cast(tf.bitwise.right_shift(bits, tf.constant(16, tf.uint32)), tf.uint16), tf.bfloat16)
    low = tf.cast(tf.bitwise.bitwise_and(bits, tf.constant(0xFFFF, tf.uint32)), tf.uint16)
    return high, low


def join_tensors(high: tf.Tensor, low: tf.Tensor) -> tf.Tensor:
    """``bitcast((high << 16) | low)`` as float32: the weight both halves came from, bit for bit."""
    upper = tf.bitwise.left_shift(tf.cast(tf.bitcast(high, tf.uint16), tf.uint32), tf.constant(16, tf.uint32))
    return tf.bitcast(tf.bitwise.bitwise_or(upper, tf.cast(low, tf.uint32)), tf.float32)


def truncate_to_bfloat16(values: tf.Tensor) -> tf.Tensor:
    """The ``high`` half of float32 ``values`` as bfloat16 (truncation toward zero, not rounding)."""
    return split_tensor(values)[0]


# ------------------------------------------------------------------ marks


def mark_split(high, low):
    """Marks ``high`` (the trainable bf16 variable) with its ``low`` partner; ``low`` gets the
    ``split_low`` kind (never trained directly). Returns ``high``."""
    if tf.as_dtype(high.dtype) != tf.bfloat16 or tf.as_dtype(low.dtype) != tf.uint16 or tuple(high.shape) != tuple(low.shape):
        raise ValueError(f"Expected a bfloat16 high half and a uint16 low half of one shape. Received: "
                         f"{high.dtype} {tuple(high.shape)} and {low.dtype} {tuple(low.shape)}")
    setattr(high, _PARTNER, mark(low, VariableKind.SPLIT_LOW))
    return high


def low_half_of(variable):
    """The ``low`` partner of a split table's ``high`` variable, or None for any other variable."""
    return getattr(variable, _PARTNER, None)


def is_split(variable) -> bool:
    return low_half_of(variable) is not None


def _tf(variable) -> tf.Variable:
    # The tf.Variable under a Keras 3 variable: gathers and scatters on it touch only their rows.
    return variable if isinstance(variable, tf.Variable) else variable.value


# ------------------------------------------------------------------ float32 rows of any table


def gather_float32(variable, rows: tf.Tensor) -> tf.Tensor:
    """``variable[rows]`` as float32 (both halves joined for a split table)."""
    low = low_half_of(variable)
    if low is None:
        return tf.gather(_tf(variable), rows)
    return join_tensors(tf.gather(_tf(variable), rows), tf.gather(_tf(low), rows))


def scatter_float32(variable, rows: tf.Tensor, values: tf.Tensor) -> None:
    """``variable[rows] = values`` (float32; split again for a split table). ``rows`` distinct."""
    low = low_half_of(variable)
    if low is None:
        _tf(variable).scatter_update(tf.IndexedSlices(tf.cast(values, tf.float32), rows))
        return
    high_values, low_values = split_tensor(values)
    _tf(variable).scatter_update(tf.IndexedSlices(high_values, rows))
    _tf(low).scatter_update(tf.IndexedSlices(low_values, rows))


def read_float32(variable, start: int | None = None, stop: int | None = None) -> tf.Tensor:
    """Rows ``[start, stop)`` (all by default) as float32; the table's exact float32 values."""
    low = low_half_of(variable)
    if low is None:
        return tf.convert_to_tensor(variable[start:stop])
    return join_tensors(tf.convert_to_tensor(variable[start:stop]), tf.convert_to_tensor(low[start:stop]))


def write_float32(variable, offset: int, values) -> None:
    """Rows ``[offset, offset + len(values))`` of ``variable`` := float32 ``values`` (split when it is)."""
    values = tf.convert_to_tensor(values, tf.float32)
    rows = tf.range(offset, offset + values.shape[0], dtype=tf.int64)
    scatter_float32(variable, rows, values)


def table_bytes(variables) -> int:
    """Bytes held by embedding variables, both halves of split tables counted."""
    total = 0
    for variable in variables:
        for part in (variable, low_half_of(variable)):
            if part is not None:
                total += int(np.prod(part.shape)) * tf.as_dtype(part.dtype).size
    return total


def add_split_weight(layer, name: str, values: np.ndarray | None = None, shape=None):
    """A split table on ``layer``: ``name`` (bf16 upper halves, trainable) and ``name + "_low"``
    (uint16 lower halves), initialised from float32 ``values``, or zeros of ``shape`` (to be filled
    block by block with :func:`scatter_float32`); returns the marked ``high`` half."""
    if values is None:
        high_init = low_init = "zeros"
    else:
        high_bits, low_bits = split_array(values)
        shape = high_bits.shape
        del values
        high_init = lambda shape, dtype, v=high_bits: tf.bitcast(tf.constant(v), tf.bfloat16)  # noqa: E731
        low_init = lambda shape, dtype, v=low_bits: tf.constant(v)  # noqa: E731
    # autocast=False: the bf16 table is read as it is (Keras would otherwise cast it on every read).
    high = layer.add_weight(name=name, shape=tuple(shape), dtype="bfloat16", trainable=True, autocast=False,
                            initializer=high_init)
    low = layer.add_weight(name=f"{name}_low", shape=tuple(shape), dtype=LOW_DTYPE, trainable=False, autocast=False,
                           initializer=low_init)
    return mark_split(high, low)


def check_split_options(compute_dtype: str, hot_rows: bool, deduplicate_exchange: bool) -> None:
    """Raises ValueError, naming the flags, for what split tables do not support."""
    if compute_dtype != "bfloat16":
        raise ValueError("--split_embedding_tables needs bfloat16 compute (--amp on CPU: mixed_bfloat16): the lookup "
                         "reads the tables' bf16 halves, and a float32 model would round their gradients to bf16. "
                         f"Received: compute dtype {compute_dtype}")
    for flag, used in (("--hot_rows_budget", hot_rows), ("--deduplicate_exchange", deduplicate_exchange)):
        if used:
            raise ValueError(f"--split_embedding_tables cannot be combined with {flag} (its replicas and rows travel "
                             "in float32). Train without one of the two flags")
