r"""What a deduplicated embedding exchange would send, counted on real batches (no training, no TF).

    python benchmarks/dedup_bytes.py --spec=DATASET/feature_spec.yaml [--world_size=2] [--batch_size=16384] [--batches=4]

For tf_dlrm's plan of the spec's tables (dim ``--dim``) on N ranks, and each global batch of the
split_binary training files: today every owned slice sends each destination one row per sample,
``local batch x width`` values. Deduplicated, it would send one row per *distinct* id of that
destination's samples plus each sample's index into them (int32): ``distinct x width`` values +
``local batch`` indices. Prints one JSON object with both byte counts (forward; the backward moves the
same) of the busiest rank, summed over the batches, and their ratio. One-hot features only (a
multi-hot feature is pooled on its owner before the exchange, one vector per sample either way).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tf_dlrm.sharding.plan import TableSpec  # noqa: E402
from tf_dlrm.sharding.planner import make_plan  # noqa: E402

DTYPES = {"int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--world_size", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=16384)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--value_bytes", type=int, default=4)
    args = parser.parse_args(argv)
    with open(args.spec) as handle:
        spec = yaml.safe_load(handle)
    names = spec["channel_spec"]["categorical"]
    cardinalities = [int(spec["feature_spec"][n]["cardinality"]) for n in names]
    files = {}
    for chunk in spec["source_spec"]["train"]:
        if chunk["type"] == "split_binary" and chunk["features"][0] in names:
            files[chunk["features"][0]] = os.path.join(os.path.dirname(os.path.abspath(args.spec)), chunk["files"][0])
    plan = make_plan([TableSpec(n, c, args.dim) for n, c in zip(names, cardinalities)], args.world_size, "auto")
    local = args.batch_size // args.world_size
    before = [0] * args.world_size
    after = [0] * args.world_size
    for rank in range(args.world_size):
        for piece in plan.rank_slices[rank]:
            name = names[piece.table]
            ids = np.fromfile(files[name], dtype=DTYPES[spec["feature_spec"][name]["dtype"]])
            for batch in range(args.batches):
                block = ids[batch * args.batch_size:(batch + 1) * args.batch_size]
                if len(block) < args.batch_size:
                    raise SystemExit(f"{files[name]}: fewer than {args.batches} batches of {args.batch_size}")
                for destination in range(args.world_size):
                    if destination == rank:
                        continue  # the block a rank keeps never leaves the process
                    samples = block[destination * local:(destination + 1) * local]
                    before[rank] += local * piece.width * args.value_bytes
                    after[rank] += len(np.unique(samples)) * piece.width * args.value_bytes + local * 4
    busiest = max(range(args.world_size), key=lambda r: before[r])
    record = {"benchmark": "dedup_bytes", "spec": args.spec, "world_size": args.world_size, "global_batch_size": args.batch_size,
              "batches": args.batches, "rank": busiest, "alltoall_forward_bytes_sent": before[busiest],
              "deduplicated_bytes_sent": after[busiest], "ratio": round(after[busiest] / before[busiest], 4) if before[busiest] else None}
    print(json.dumps(record), flush=True)
    return record


if __name__ == "__main__":
    main()
