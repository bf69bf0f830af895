r"""The sparse TensorFlow ops under the embedding lookup and update, alone, at criteo_capped's sizes.

    python benchmarks/sparse_ops.py [--rows=1700000] [--dim=128] [--ids=53248] [--threads=0] [--repeats=9]

A step of criteo_capped (26 tables, about 1.7M rows of width 128 fused per variable, batch 2048) gathers
and updates a few tens of thousands of rows. The sparse optimizers' state updates go through TensorFlow's
``tf.gather``, ``ResourceScatterSub``/``ResourceScatterUpdate``, ``tf.unique`` and
``tf.math.unsorted_segment_sum``; plain SGD on a bag-read table goes through tf_dlrm's own
``tf_dlrm_sparse_apply_sgd`` kernel. Each op is timed alone, inside a ``tf.function``, on the same
random rows (distinct, as the optimizers see them), so that two TensorFlow releases can be compared op by
op: run the script under each release's environment, on the same machine, taking turns.

Prints one JSON object per op: ``{"benchmark": "sparse_ops", "op": ..., "tensorflow": version,
"ms": {"median", "min", "max"}, "rows_touched": n, "rows_per_s": ...}``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from emit import emit  # noqa: E402


def timed(function, repeats: int, calls: int) -> list[float]:
    function()  # trace and warm
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            function()
        times.append((time.perf_counter() - started) / calls * 1e3)
    return times


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_700_000, help="rows of the fused table")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--ids", type=int, default=2048 * 26, help="ids drawn per step (made distinct)")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: TensorFlow's default)")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args(argv)

    import tensorflow as tf

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    from tf_dlrm.ops.embedding_bag import bag_kernel

    table = tf.Variable(tf.random.stateless_normal([args.rows, args.dim], [1, 2]))
    state = tf.Variable(tf.zeros([args.rows, args.dim]))
    ids = tf.random.stateless_uniform([args.ids], [3, 4], 0, args.rows, dtype=tf.int64)
    rows = tf.unique(ids)[0]
    values = tf.random.stateless_normal([tf.shape(rows)[0], args.dim], [5, 6])
    segments = tf.random.stateless_uniform([args.ids], [7, 8], 0, tf.shape(rows, out_type=tf.int64)[0], dtype=tf.int64)
    repeated = tf.random.stateless_normal([args.ids, args.dim], [9, 10])

    ops = {
        "gather": lambda: tf.reduce_sum(tf.gather(table, rows)),
        # tf.function runs a stateful op it does not return (automatic control dependencies).
        "scatter_sub": lambda: [table.scatter_sub(tf.IndexedSlices(values, rows)), tf.constant(0)][1],
        "scatter_update": lambda: [state.scatter_update(tf.IndexedSlices(values, rows)), tf.constant(0)][1],
        "unique": lambda: tf.shape(tf.unique(ids)[0]),
        "unsorted_segment_sum": lambda: tf.reduce_sum(
            tf.math.unsorted_segment_sum(repeated, segments, tf.shape(rows, out_type=tf.int64)[0])),
    }
    library = bag_kernel()
    if library is not None:
        ops["tf_dlrm_sparse_apply_sgd"] = lambda: [library.tf_dlrm_sparse_apply_sgd(
            table=table.handle, rows=rows, gradient=values, learning_rate=tf.constant(1e-3)), tf.constant(0)][1]
    touched = int(rows.shape[0])
    for name, body in ops.items():
        times = timed(tf.function(body, autograph=False), args.repeats, args.calls)
        median = statistics.median(times)
        emit({"benchmark": "sparse_ops", "op": name, "tensorflow": tf.__version__, "rows": args.rows, "dim": args.dim,
              "rows_touched": touched, "intra_op_threads": args.threads,
              "ms": {"median": round(median, 3), "min": round(min(times), 3), "max": round(max(times), 3)},
              "rows_per_s": round(touched / median * 1e3)})


if __name__ == "__main__":
    main()
