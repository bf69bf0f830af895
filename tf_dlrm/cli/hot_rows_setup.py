"""``--hot_rows_budget``: which rows a run replicates, from the training split's id counts.

Rank 0 counts the ids (or reads ``id_counts.npz`` next to the dataset, :mod:`tf_dlrm.data.id_counts`)
and writes the file when it is missing; the other ranks wait for it and read it, so every rank plans
the same hot rows (:func:`tf_dlrm.sharding.hot_rows.plan_hot_rows`). With ``--hot_rows_min_per_step``
only rows looked up at least that many times per global batch on average are replicated
(:func:`tf_dlrm.sharding.hot_rows.min_count_for` explains N).
"""

from __future__ import annotations

import math

import tensorflow as tf

from tf_dlrm.parallel import collectives
from tf_dlrm.sharding.hot_rows import HotRowPlan, plan_hot_rows


def hot_row_plan(spec, plan, sharding, env, split: str, global_batch_size: int) -> HotRowPlan | None:
    """Collective: the run's hot-row plan, or None (budget 0, one rank, or no model-parallel table)."""
    from tf_dlrm.data import id_counts

    from tf_dlrm.cli import dynamic_builder

    budget = sharding.hot_rows_budget
    if budget and dynamic_builder.has_dynamic_tables(spec):  # before counting ids the plan does not index
        raise ValueError("--hot_rows_budget is implemented for models that read the spec's columns as they are, on "
                         "fixed tables (e.g. --model=dlrm). Received: dynamic tables")
    if not budget or env.world_size < 2 or not plan.model_parallel:
        return None
    error = ""
    if env.is_chief:
        try:
            id_counts.counts_for(spec, split)  # writes id_counts.npz when it is missing
        except (ValueError, OSError) as failure:
            error = str(failure)
    # Everyone waits for rank 0's file (and learns about its failure).
    failed = collectives.broadcast(env, tf.constant([1 if error else 0], tf.int32), name="hot_rows_counts_ready")
    if int(failed.numpy()[0]):
        raise ValueError(f"--hot_rows_budget: counting the ids of split {split!r} failed on rank 0: {error or 'see rank 0'}")
    counts = id_counts.counts_for(spec, split)
    samples = spec.split_files(split).num_samples
    min_count = 1
    if sharding.hot_rows_min_per_step:
        min_count = max(1, math.ceil(sharding.hot_rows_min_per_step * samples / global_batch_size))
    return plan_hot_rows(plan, [counts[name] for name in spec.categorical_features], budget, min_count=min_count)


def as_layer_option(hot: HotRowPlan | None) -> dict | None:
    """``{table index: ids}`` for :class:`~tf_dlrm.embedding.DistributedEmbedding`."""
    if hot is None:
        return None
    return {rows.table: list(rows.ids) for rows in hot.tables}


def report_plan(reporter, hot: HotRowPlan | None, sync_every: int = 1) -> None:
    """Says and logs the plan (``hot_rows`` event), with ``--hot_row_sync_every`` (``sync_every``)."""
    if hot is None:
        return
    reporter.say(hot.describe())
    reporter.say("hot rows: gradients combined every step (exact)" if sync_every == 1 else
                 f"hot rows: local updates merged every {sync_every} steps (--hot_row_sync_every)")
    reporter.event("hot_rows", budget=hot.budget, budget_bytes=hot.budget_bytes, hot_bytes=hot.hot_bytes, sync_every=sync_every,
                   expected_hit_rate=round(hot.overall_hit_rate, 4),
                   tables=[{"table": t.table, "name": t.name, "hot_rows": t.count, "expected_hit_rate": round(t.hit_rate, 4)}
                           for t in hot.tables])


def report_measured(reporter, embedding, trainer) -> None:
    """Collective: the hot-row hit rates and bytes the run measured, per rank and in all.

    ``exchanged_bytes_ratio``: over all ranks and calls, (cold rows forward and their gradients
    backward + int32 codes + the hot gradients' allgathers, or with ``--hot_row_sync_every > 1`` the
    merges' allgathers) / (the plain exchange's rows forward and backward). Training steps and
    evaluation calls are both counted by the forward counters; the allgathers happen in training
    only, so with evaluation the ratio is a little low. ``merges``: how many merges ran (None with
    the exact combine).
    """
    traffic = embedding.hot_row_traffic() if hasattr(embedding, "hot_row_traffic") else None
    if traffic is None:
        return
    gathered = collectives.allgather(trainer.env, tf.reshape(trainer.hot_gradient_bytes_sent.value(), [1])).numpy()
    for record, sent in zip(traffic, gathered):
        record["hot_gradient_bytes_sent"] = int(sent)
    plain = sum(8 * t["plain_values"] for t in traffic)
    exchanged = sum(8 * t["cold_values_sent"] + 4 * t["codes_sent"] + t["hot_gradient_bytes_sent"] for t in traffic)
    ratio = round(exchanged / plain, 4) if plain else None
    sync = getattr(trainer, "hot_sync", None)
    merges = int(sync.merges.numpy()) if sync is not None else None
    reporter.event("hot_rows_measured", ranks=traffic, exchanged_bytes_ratio=ratio, exchanged_bytes=exchanged,
                   hot_row_sync_every=sync.every if sync is not None else 1, merges=merges)
    reporter.say("hot rows measured: " + "; ".join(
        f"rank {t['rank']} hit rate {t['hit_rate']}, forward bytes {t['sent_ratio']} of the plain exchange's" for t in traffic)
        + f"; all bytes exchanged (both directions, hot gradients included): {ratio} of the plain exchange's")
