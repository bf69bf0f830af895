"""The assembly kernel (tf_dlrm/ops/assemble_columns.cc) against split + concat + column gather, in
values and gradients, for every dtype it takes; its layout (pure Python) and its refusals."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tf_dlrm import ops
from tf_dlrm.ops.assemble import assemble_columns, assemble_kernel, assembly_layout
from tf_dlrm.embedding.exchange import permute

BATCH = 7
# Part 0 is flat, as the alltoall delivers it: three sources' [b, 3], [b, 1] (padding) and [b, 4]
# blocks one after the other; part 1 is a replicated lookup [b, 2].
CHUNKS = [[3, 1, 4], [2]]
# Joined columns: part 0's chunks side by side (0-7), then part 1 (8-9); column 3 is padding.
PERMUTATION = [8, 9, 4, 5, 0, 1, 2, 6, 7]


def parts_and_reference(dtype, rng):
    flat = rng.standard_normal(BATCH * 8).astype(np.float32)
    replicated = rng.standard_normal((BATCH, 2)).astype(np.float32)

    def reference(flat, replicated):
        chunks = tf.split(flat, [BATCH * w for w in CHUNKS[0]])
        joined = tf.concat([tf.reshape(c, [BATCH, w]) for c, w in zip(chunks, CHUNKS[0])] + [replicated], axis=1)
        return permute(joined, np.array(PERMUTATION), axis=1)

    return tf.cast(flat, dtype), tf.cast(replicated, dtype), reference


def test_layout_merges_consecutive_columns_into_runs():
    layout = assembly_layout(CHUNKS, PERMUTATION)
    assert layout == {"chunk_widths": [3, 1, 4, 2], "chunks_per_part": [3, 1], "run_chunks": [3, 2, 0, 2],
                      "run_columns": [0, 0, 0, 2], "run_lengths": [2, 2, 3, 2]}
    # Whole 128-wide tables moving as blocks: one run per table, not per column.
    tables = assembly_layout([[256], [128]], list(range(256, 384)) + list(range(256)))
    assert tables["run_lengths"] == [128, 256]


@pytest.mark.parametrize("chunks, permutation, message", [
    ([[2], [0]], [0, 1], "at least one column"),
    ([[2, 2]], [0, 4], "outside \\[0, 4\\)"),
    ([[2, 2]], [1, 1], "twice"),
])
def test_layout_refuses_what_the_op_cannot_do(chunks, permutation, message):
    with pytest.raises(ValueError, match=message):
        assembly_layout(chunks, permutation)


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16, tf.float16])
def test_values_and_gradients_equal_split_concat_and_gather(dtype):
    assert assemble_kernel() is not None, f"{ops.LIBRARY} is not built (python -m tf_dlrm.ops.build)"
    rng = np.random.default_rng(3)
    flat, replicated, reference = parts_and_reference(dtype, rng)
    upstream = tf.cast(rng.standard_normal((BATCH, len(PERMUTATION))).astype(np.float32), dtype)
    layout = assembly_layout(CHUNKS, PERMUTATION)

    def run(function):
        with tf.GradientTape() as tape:
            tape.watch([flat, replicated])
            out = function(flat, replicated)
            loss = tf.reduce_sum(tf.cast(out * upstream, tf.float32))
        return out, tape.gradient(loss, [flat, replicated])

    assembled, gradients = run(lambda a, b: assemble_columns([a, b], layout))
    expected, expected_gradients = run(reference)
    assert assembled.dtype == dtype and assembled.shape == (BATCH, len(PERMUTATION))
    np.testing.assert_array_equal(assembled.numpy(), expected.numpy())  # copies: bit for bit
    for got, want in zip(gradients, expected_gradients):
        assert got.shape == want.shape
        np.testing.assert_array_equal(tf.convert_to_tensor(got).numpy(), tf.convert_to_tensor(want).numpy())
    # The padding chunk (column 3 of the joined block) is read by nobody: its gradient is zero.
    padding = gradients[0].numpy()[BATCH * 3:BATCH * 4]
    np.testing.assert_array_equal(padding, np.zeros(BATCH))


def test_in_a_traced_function_with_an_unknown_batch():
    layout = assembly_layout(CHUNKS, PERMUTATION)
    rng = np.random.default_rng(4)
    flat, replicated, reference = parts_and_reference(tf.float32, rng)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32), tf.TensorSpec([None, 2], tf.float32)])
    def traced(a, b):
        return assemble_columns([a, b], layout)

    assert traced.get_concrete_function().structured_outputs.shape.as_list() == [None, len(PERMUTATION)]
    np.testing.assert_array_equal(traced(flat, replicated).numpy(), reference(flat, replicated).numpy())


def test_parts_of_the_wrong_size_are_refused_naming_the_part():
    layout = assembly_layout(CHUNKS, PERMUTATION)
    flat = tf.zeros([BATCH * 8])
    with pytest.raises(tf.errors.InvalidArgumentError, match="part 1 should hold 7 rows of 2 columns"):
        assemble_columns([flat, tf.zeros([BATCH, 3])], layout)
    with pytest.raises(tf.errors.InvalidArgumentError, match="part 1 should hold 7 rows of 2 columns"):
        assemble_columns([flat, tf.zeros([BATCH + 1, 2])], layout)


def test_a_layout_that_reads_a_column_twice_is_refused_by_the_op():
    layout = {"chunk_widths": [4], "chunks_per_part": [1], "run_chunks": [0, 0], "run_columns": [0, 1], "run_lengths": [2, 2]}
    with pytest.raises(tf.errors.InvalidArgumentError, match="column 1 of chunk 0 is read by more than one run"):
        assemble_columns([tf.zeros([3, 4])], layout)
