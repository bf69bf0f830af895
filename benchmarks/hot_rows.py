r"""Alltoall bytes per step with and without hot-row replication, counted on sampled batches (no TF).

    python benchmarks/hot_rows.py --source=zipf:1.05 [--world_size=2] [--budget=0.1] [--batch_size=16384]
    python benchmarks/hot_rows.py --source=criteo:../shared/data/criteo_1tb_day0_sample_1k.tsv

Tables: the 26 MLPerf Criteo cardinalities capped at ``--max_rows`` (zipf), or for ``criteo:`` one table
per categorical column with the column's distinct values as rows and ids drawn from their frequencies in
the file. Id counts come from ``--count_batches`` batches; the bytes from ``--batches`` further ones.
Per model-parallel slice of the busiest rank: without replication it sends every other rank one row per
sample (``local batch x width`` values, forward; the backward the same). With replication only rows of
cold ids are sent, and each rank sends the others its distinct touched hot ids (int64) with their
gradient rows (the sparse hot-row allgather). One JSON line per case: ``counted_hit_rate`` is the
plan's rate on the batches it counted, ``measured_hit_rate`` the rate on the further batches.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tf_dlrm.sharding.hot_rows import plan_hot_rows  # noqa: E402
from tf_dlrm.sharding.plan import TableSpec  # noqa: E402
from tf_dlrm.sharding.planner import make_plan  # noqa: E402

CRITEO_CARDINALITIES = [40000000] * 4 + [
    40790948, 3067956, 590152, 405282, 39060, 20265, 17295, 12973, 11938, 7424, 7122, 2209,
    1543, 976, 155, 108, 63, 36, 14, 10, 4, 3]


def zipf_sampler(cardinalities, exponent, rng):
    def draw(count):
        out = []
        for rows in cardinalities:
            uniform = rng.random(count)
            power = 1.0 - exponent
            values = (1.0 + uniform * ((rows + 1.0) ** power - 1.0)) ** (1.0 / power)
            out.append(np.minimum(values.astype(np.int64) - 1, rows - 1))
        return out
    return draw


def criteo_sampler(path, rng):
    with open(path) as handle:
        rows = list(csv.reader(handle, delimiter="\t"))
    columns = list(zip(*rows))[14:40]
    probabilities = []
    for column in columns:
        _, counts = np.unique(np.array(column), return_counts=True)
        probabilities.append(np.sort(counts)[::-1] / counts.sum())
    cardinalities = [len(p) for p in probabilities]

    def draw(count):
        return [rng.choice(len(p), count, p=p) for p in probabilities]
    return cardinalities, draw


def measure(plan, hot, draw, world_size, batch_size, batches, value_bytes=4):
    local = batch_size // world_size
    hot_sets = {t: np.array(hot.for_table(t), dtype=np.int64) for t in plan.model_parallel}
    # Sent by each rank, forward and backward: the owner sends a destination the rows of its local
    # samples, and the destination sends their gradients back.
    before = np.zeros(world_size)
    after = np.zeros(world_size)
    gather = np.zeros(world_size)
    hits = lookups = 0
    for _ in range(batches):
        ids = draw(batch_size)
        for rank in range(world_size):
            for piece in plan.rank_slices[rank]:
                column = ids[piece.table]
                cold = ~np.isin(column, hot_sets[piece.table])
                for destination in range(world_size):
                    if destination == rank:
                        continue
                    part = cold[destination * local:(destination + 1) * local]
                    for sender in (rank, destination):
                        before[sender] += local * piece.width * value_bytes
                        after[sender] += int(part.sum()) * piece.width * value_bytes
        for table in plan.model_parallel:
            hits += int(np.isin(ids[table], hot_sets[table]).sum())
            lookups += ids[table].size
        for rank in range(world_size):  # hot-row gradient allgather: distinct touched hot ids of this rank
            for table in plan.model_parallel:
                column = ids[table][rank * local:(rank + 1) * local]
                touched = np.unique(column[np.isin(column, hot_sets[table])])
                gather[rank] += (world_size - 1) * touched.size * (plan.tables[table].dim * value_bytes + 8)
    # The allgather of hot-row gradients runs once, in the backward.
    busiest = int(np.argmax(before))
    plain = before[busiest] / batches
    replicated = (after[busiest] + gather[busiest]) / batches
    return busiest, plain, replicated, hits / max(lookups, 1)


def main(argv=None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default="zipf:1.05")
    parser.add_argument("--world_size", type=int, default=2)
    parser.add_argument("--budget", type=float, default=0.1)
    parser.add_argument("--batch_size", type=int, default=16384)
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--count_batches", type=int, default=20)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--max_rows", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    kind, _, value = args.source.partition(":")
    if kind == "zipf":
        cardinalities = [min(c, args.max_rows) for c in CRITEO_CARDINALITIES]
        draw = zipf_sampler(cardinalities, float(value), rng)
        threshold = 2048
    elif kind == "criteo":
        cardinalities, draw = criteo_sampler(value, rng)
        threshold = 1  # the sample's tables are tiny: make them all model-parallel to see their skew
    else:
        raise SystemExit(f"--source must be zipf:EXPONENT or criteo:PATH. Received: {args.source!r}")
    plan = make_plan([TableSpec(f"t{i}", c, args.dim) for i, c in enumerate(cardinalities)], args.world_size,
                     "auto", data_parallel_threshold=threshold)
    counts = [np.zeros(c, np.int64) for c in cardinalities]
    for _ in range(args.count_batches):
        for table, column in enumerate(draw(args.batch_size)):
            counts[table] += np.bincount(column, minlength=cardinalities[table])
    hot = plan_hot_rows(plan, counts, args.budget)
    busiest, plain, replicated, measured = measure(plan, hot, draw, args.world_size, args.batch_size, args.batches)
    record = {"benchmark": "hot_rows", "source": args.source, "world_size": args.world_size, "budget": args.budget,
              "global_batch_size": args.batch_size, "dim": args.dim, "rank": busiest,
              "hot_bytes": hot.hot_bytes, "budget_bytes": hot.budget_bytes,
              "counted_hit_rate": round(hot.overall_hit_rate, 4),
              "measured_hit_rate": round(measured, 4),
              "bytes_per_step_plain": int(plain), "bytes_per_step_hot_rows": int(replicated),
              "ratio": round(replicated / plain, 4) if plain else None}
    print(json.dumps(record), flush=True)
    return [record]


if __name__ == "__main__":
    main()
