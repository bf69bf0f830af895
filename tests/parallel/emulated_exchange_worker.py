"""One rank of tests/parallel/test_emulated_cluster.py's exchange measurement, run in an emulated
cluster's namespace.

    worker.py OUT_JSON PREFIX VALUES REPEATS BANDWIDTH_MBIT[,BANDWIDTH_MBIT...]

For each bandwidth in turn, rank 0 reshapes every link of the cluster named PREFIX (root in any
namespace can: ``tc -n`` reaches the others) between two barriers, then all ranks time REPEATS
alltoalls of VALUES float32 each (the embedding exchange's collective), after one untimed. Rank 0
writes ``{"seconds": {bandwidth: [per-alltoall seconds]}, "bytes_sent_per_rank": ...}``.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"))


def main(out_path: str, prefix: str, values: int, repeats: int, bandwidths: list[float]) -> None:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from emulated_cluster import EmulatedCluster

    hvd.init()
    size, rank = hvd.size(), hvd.rank()
    block = tf.fill([values], float(rank))
    exchange = tf.function(lambda t: hvd.alltoall(t, name="emulated_exchange"))
    barrier = tf.function(lambda: hvd.allreduce(tf.zeros([1]), name="emulated_barrier"))
    seconds = {}
    for bandwidth in bandwidths:
        barrier()
        if rank == 0:
            EmulatedCluster(size, bandwidth, prefix=prefix).reshape(bandwidth, 0.0)
        barrier()
        received = exchange(block).numpy()
        # Every rank's values came back whole: value r from rank r, in rank order.
        expected = [float(r) for r in range(size) for _ in range(values // size)]
        assert received.tolist() == expected, received[:8]
        seconds[str(bandwidth)] = []
        for _ in range(repeats):
            barrier()
            started = time.perf_counter()
            exchange(block).numpy()
            seconds[str(bandwidth)].append(time.perf_counter() - started)
    if rank == 0:
        with open(out_path, "w") as handle:
            json.dump({"seconds": seconds, "world_size": size, "bytes_sent_per_rank": values * 4 * (size - 1) // size}, handle)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), [float(b) for b in sys.argv[5].split(",")])
