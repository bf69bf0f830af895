"""Hot-row replication in the scaling model: expected hit rates and bytes under Zipf ids (numpy, no TF).

Ids of table ``t`` (``n`` rows) follow Zipf's law with exponent ``s``: id ``i`` (1-based, by
frequency) has probability ``p_i = i^-s / H(n, s)``, ``H(n, s) = sum_{i<=n} i^-s``. Every sample
looks up each table once, so the planner's choice (:func:`tf_dlrm.sharding.hot_rows.plan_hot_rows`:
most lookups saved per byte first) is, for tables of one width, a common probability threshold
``lambda``: table ``t`` replicates its ``k_t`` rows with ``p_i >= lambda``, the largest ``lambda`` whose
rows fit the budget. Its hit rate is ``H(k_t, s) / H(n, s)``.

Bytes per step of the busiest rank, the same accounting as ``benchmarks/hot_rows.py`` (which counts
them on sampled ids): a sample's row of an owned slice travels (forward, and its gradient backward)
only when its id is cold, so each slice sends every other rank ``b (1 - h_t) w`` values, and receives
as many gradients back; and every
rank sends the ``N - 1`` others its distinct touched hot ids (int64) with their gradient rows, the
expected count of distinct hot ids among ``b`` draws being ``sum_{i<=k} 1 - (1 - p_i)^b``. That
allgather grows with N; the cheaper of it and an allreduce of the union's rows (ids allgathered, then
one ring allreduce of the global batch's distinct hot rows) is the figure used for the step.

Sums over millions of ids are evaluated exactly for the first ids and by the trapezoid rule on a
geometric grid beyond (the summands are smooth and monotone there), within 1e-4 relative.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

EXACT_TERMS = 20_000
GRID_POINTS = 4_000


def _terms(function, count: int) -> float:
    """``sum_{i=1}^{count} function(i)`` for a smooth, monotone ``function`` of float64 arrays."""
    if count <= 0:
        return 0.0
    exact = min(count, EXACT_TERMS)
    total = float(function(np.arange(1, exact + 1, dtype=np.float64)).sum())
    if count > exact:
        # sum_{i=a}^{b} f(i) ~ integral of f over [a - 1/2, b + 1/2] (midpoint rule, f smooth there).
        grid = np.geomspace(exact + 0.5, count + 0.5, GRID_POINTS)
        values = function(grid)
        total += float(((values[1:] + values[:-1]) * np.diff(grid)).sum() / 2)
    return total


def harmonic(count: int, exponent: float) -> float:
    """``H(count, exponent) = sum_{i<=count} i^-exponent``."""
    return _terms(lambda i: i ** -exponent, count)


def distinct_draws(count: int, exponent: float, rows: int, draws: int) -> float:
    """Expected distinct ids among the ``count`` most frequent, in ``draws`` Zipf draws over ``rows`` ids."""
    norm = harmonic(rows, exponent)
    # 1 - (1 - p)^b written as -expm1(b log1p(-p)): exact for the tiny p of rare ids.
    return _terms(lambda i: -np.expm1(draws * np.log1p(-(i ** -exponent) / norm)), count)


def rows_above(threshold: float, rows: int, exponent: float, norm: float) -> int:
    """How many ids have ``p_i >= threshold``: ``i <= (threshold H)^(-1/s)``."""
    if exponent <= 0:
        return rows if 1.0 / rows >= threshold else 0
    return int(min(rows, math.floor((threshold * norm) ** (-1.0 / exponent) + 1e-9)))


def plan_zipf_hot_rows(rows: Sequence[int], dims: Sequence[int], exponents: Sequence[float],
                       budget_bytes: int, value_bytes: int = 4, min_probability: float = 0.0) -> list[dict]:
    """Hot rows per table (``count`` and ``hit_rate``) for the largest common threshold within the budget.

    ``rows``, ``dims``, ``exponents``: the model-parallel tables. Dims may differ: the threshold is
    then on lookups per byte, ``p_i / (dim * value_bytes)``, as the planner ranks them.
    ``min_probability``: rows less likely than this stay cold even when the budget has room.
    """
    norms = [harmonic(n, s) for n, s in zip(rows, exponents)]
    row_bytes = [d * value_bytes for d in dims]

    def counts(threshold):  # threshold on p / row_bytes
        return [rows_above(threshold * b, n, s, h) for n, s, h, b in zip(rows, exponents, norms, row_bytes)]

    def used(threshold):
        return sum(k * b for k, b in zip(counts(threshold), row_bytes))

    high = max(1.0 / (h * b) for h, b in zip(norms, row_bytes)) * 2  # above every id's density: nothing hot
    low = min(n ** -max(s, 0.0) / (h * b) for n, s, h, b in zip(rows, exponents, norms, row_bytes)) / 2
    if used(low) <= budget_bytes:
        high = low  # everything fits
    else:
        for _ in range(200):  # bisection on a log scale
            middle = math.sqrt(low * high)
            if used(middle) <= budget_bytes:
                high = middle
            else:
                low = middle
    chosen = [min(k, rows_above(min_probability, n, s, h)) if min_probability > 0 else k
              for k, n, s, h in zip(counts(high), rows, exponents, norms)]
    return [{"count": k, "hit_rate": harmonic(k, s) / h, "bytes": k * b}
            for k, s, h, b in zip(chosen, exponents, norms, row_bytes)]


def hot_row_figures(plan, exponents: Sequence[float], budget: float, global_batch: int, value_bytes: int = 4,
                    min_count_per_step: float = 0.0) -> dict:
    """Hot rows of ``plan``'s model-parallel tables under ``budget`` and each rank's bytes per step.

    ``exponents``: one Zipf exponent per table of the plan (0 = uniform ids). ``min_count_per_step``:
    replicate only rows expected at least this often in a global batch. Replication pays when a row is
    looked up more than about N times a step: the alltoall moves ``2 B F D`` values over all ranks, the
    hot rows' combine about ``2 N U D`` (``U`` distinct hot ids of the batch, every rank receiving all).
    """
    world_size = plan.world_size
    local = global_batch // world_size
    tables = list(plan.model_parallel)
    specs = [plan.tables[t] for t in tables]
    total = sum(s.elements for s in specs) * value_bytes
    hot = plan_zipf_hot_rows([s.rows for s in specs], [s.dim for s in specs], [exponents[t] for t in tables],
                             int(budget * total), value_bytes, min_probability=min_count_per_step / global_batch)
    by_table = dict(zip(tables, hot))
    lookups = global_batch * len(tables)
    hits = sum(h["hit_rate"] for h in hot) * global_batch
    # Every rank touches the same expected number of distinct hot ids (same distribution, same b).
    touched = {t: distinct_draws(by_table[t]["count"], exponents[t], plan.tables[t].rows, local) for t in tables}
    gather_sent = (world_size - 1) * sum(touched[t] * (plan.tables[t].dim * value_bytes + 8) for t in tables)
    # The other way to combine them: allgather only the ids, then one ring allreduce of the gradient
    # rows of their union (the distinct hot ids of the global batch, the same sorted list on every
    # rank): constant per rank in N, where the allgather of rows grows with N.
    union = {t: distinct_draws(by_table[t]["count"], exponents[t], plan.tables[t].rows, global_batch) for t in tables}
    union_sent = ((world_size - 1) * sum(touched.values()) * 8
                  + 2 * (world_size - 1) / world_size * sum(union[t] * plan.tables[t].dim * value_bytes for t in tables))
    combine, combine_sent = min((("allgather_rows", gather_sent), ("allreduce_union", union_sent)), key=lambda c: c[1])
    # Each owner sends every destination the rows of its local samples (forward), the destination
    # sends their gradients back (backward): both directions count for both ends' sent bytes.
    sent_plain, sent_cold = [0.0] * world_size, [0.0] * world_size
    for owner in range(world_size):
        for piece in plan.rank_slices[owner]:
            values = local * piece.width * value_bytes
            for destination in range(world_size):
                if destination != owner:
                    for sender in (owner, destination):
                        sent_plain[sender] += values
                        sent_cold[sender] += values * (1 - by_table[piece.table]["hit_rate"])
    ranks = []
    for rank in range(world_size):
        plain, cold = sent_plain[rank], sent_cold[rank]
        gather = combine_sent if world_size > 1 else 0.0
        ranks.append({"plain": plain, "cold_alltoall": cold, "hot_gradients": gather, "with_hot_rows": cold + gather})
    busiest = max(range(world_size), key=lambda r: ranks[r]["plain"])
    figures = ranks[busiest]
    with_hot = figures["with_hot_rows"]
    return {
        "hot_bytes_per_rank": sum(h["bytes"] for h in hot),
        "hot_rows": sum(h["count"] for h in hot),
        "expected_hit_rate": hits / lookups if lookups else 0.0,
        "busiest_rank": busiest,
        "alltoall_bytes_per_step_plain": figures["plain"],
        "cold_alltoall_bytes_per_step": figures["cold_alltoall"],
        "hot_gradient_allgather_bytes_per_step": gather_sent if world_size > 1 else 0.0,
        "hot_gradient_union_allreduce_bytes_per_step": union_sent if world_size > 1 else 0.0,
        "hot_gradient_combine": combine,
        "bytes_per_step_with_hot_rows": with_hot,
        "ratio": with_hot / figures["plain"] if figures["plain"] else None,
        "exchange_bytes_per_rank": [r["with_hot_rows"] for r in ranks],
    }


def fit_exponent(counts) -> float | None:
    """Least-squares slope ``s`` of ``log count = c - s log rank`` over the nonzero counts (rank 1 most frequent)."""
    ordered = np.sort(np.asarray([c for c in counts if c > 0], dtype=np.float64))[::-1]
    if ordered.size < 3:
        return None
    xs, ys = np.log(np.arange(1, ordered.size + 1)), np.log(ordered)
    slope = ((xs - xs.mean()) * (ys - ys.mean())).sum() / ((xs - xs.mean()) ** 2).sum()
    return round(float(-slope), 3)
