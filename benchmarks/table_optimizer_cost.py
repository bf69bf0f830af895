"""Time of one sparse update of a large table, per embedding optimizer of the table-optimizer study.

    .venv/bin/python benchmarks/table_optimizer_cost.py [--rows=1000000] [--width=64] [--touched=65536] [--repeats=20]

Each optimizer updates ``--touched`` distinct random rows of a ``[rows, width]`` float32 table with a
random gradient, ``--repeats`` times inside one ``tf.function``-compiled step (after one warm-up call);
prints one JSON line per optimizer with the median, min and max milliseconds per update, and the bytes
of optimizer state per table row. ``lazy_adam`` runs tf_dlrm's fused kernel when the library is built
(the rows are marked distinct); the others run TensorFlow gathers and scatters.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import tensorflow as tf

from emit import emit  # also puts the repository on sys.path

from tf_dlrm.optimizers.catch_up_adam import SparseCatchUpAdam  # noqa: E402
from tf_dlrm.optimizers.dense_adam import SparseDenseAdam  # noqa: E402
from tf_dlrm.optimizers.lazy_adam import SparseLazyAdam  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--touched", type=int, default=65_536)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--optimizers", default="lazy_adam,catch_up_adam,dense_adam")
    args = parser.parse_args()
    made = {"lazy_adam": SparseLazyAdam, "catch_up_adam": SparseCatchUpAdam, "dense_adam": SparseDenseAdam}
    rng = np.random.default_rng(0)
    for name in args.optimizers.split(","):
        optimizer = made[name]()
        table = tf.Variable(rng.uniform(-0.05, 0.05, (args.rows, args.width)).astype(np.float32))
        slots = optimizer.create_slots(table)
        step_counter = tf.Variable(0, dtype=tf.int64)

        @tf.function
        def update(rows, gradient):
            step_counter.assign_add(1)
            optimizer.apply(table, slots, rows, gradient, tf.constant(0.003), step_counter)

        times = []
        for repeat in range(args.repeats + 1):
            rows = tf.constant(np.sort(rng.choice(args.rows, args.touched, replace=False)).astype(np.int64))
            gradient = tf.constant(rng.normal(size=(args.touched, args.width)).astype(np.float32))
            started = time.perf_counter()
            update(rows, gradient)  # returns once its stateful ops ran (no read of the table: it would copy it)
            if repeat:
                times.append(1e3 * (time.perf_counter() - started))
        emit({"benchmark": "table_optimizer_cost", "config": f"{args.rows}x{args.width}, {args.touched} rows touched",
              "impl": name, "ms_per_update": {"median": float(np.median(times)), "min": float(np.min(times)),
                                              "max": float(np.max(times))},
              "state_bytes_per_row": 4 * args.width * len(optimizer.slots)})
        del table, slots


if __name__ == "__main__":
    sys.exit(main())
