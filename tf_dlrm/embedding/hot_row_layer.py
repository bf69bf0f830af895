"""The hot-row replicas of a :class:`~tf_dlrm.embedding.DistributedEmbedding` (a mixin).

A table's ``Placement(hot_rows=ids)`` (model-parallel tables; ``main.py`` takes them from
:func:`tf_dlrm.sharding.hot_rows.plan_hot_rows`) gives every rank a ``hot`` variable per such table,
``[len(ids), D]``, initialised to those rows' initial values (:func:`initial_table_rows`), and makes
the layer exchange only cold rows (:mod:`tf_dlrm.embedding.hot_row_exchange`). In one process
there is nothing to exchange: the replicas are not made and the option changes nothing.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_dlrm.parallel import collectives
from tf_dlrm.embedding.hot_row_exchange import OUTSIDE, hot_codes, hot_row_exchange
from tf_dlrm.sharding.packing import group_entries, packing_groups
from tf_dlrm.embedding.table_init import initial_table_rows
from tf_dlrm.embedding.variable_kind import VariableKind, mark


def checked_hot_rows(hot_rows, table_names, cardinalities, model_parallel) -> dict[int, tuple[int, ...]]:
    """``{table index: sorted distinct ids}`` (the tables' ``Placement(hot_rows=...)``), checked against the plan;
    errors name the table."""
    result = {}
    for table, ids in hot_rows.items():
        if not ids:
            continue
        name = table_names[table]
        if table not in model_parallel:
            raise ValueError(f"Table {name!r} has Placement(hot_rows=...) but is replicated on every rank (its "
                             "vocabulary is under data_parallel_threshold): give it a model-parallel placement")
        if ids[-1] >= cardinalities[table]:
            raise ValueError(f"Expected the hot_rows of table {name!r} in [0, {cardinalities[table]}). "
                             f"Received: {ids[-1]}")
        result[table] = tuple(int(v) for v in ids)
    return result


class HotRowReplicas:
    """Replicas of hot rows for the layer it is mixed into (see the module docstring)."""

    def _init_hot_rows(self, hot_rows) -> None:
        names = [t.name for t in self.plan.tables]
        self.hot_rows = checked_hot_rows(hot_rows, names, self.cardinalities, set(self.model_parallel))
        # In one process nothing travels: the option is kept (get_config) but executes nothing.
        self.hot_tables = tuple(sorted(self.hot_rows)) if self.plan.world_size > 1 else ()
        self.hot_variables = []
        if not self.hot_tables:
            return
        problems = []
        if self.deduplicate_exchange:
            problems.append("--deduplicate_exchange")
        multi_hot = [f.name for f, t in zip(self.features, self.feature_tables) if not f.one_hot and t in self.hot_rows]
        if multi_hot:
            problems.append(f"multi-hot features {multi_hot} on tables with hot rows")
        if problems:
            raise ValueError("hot rows (--hot_rows_budget) are executed for one-hot features only; they cannot be "
                             f"combined with {', '.join(problems)}")

    def _build_hot_rows(self) -> None:
        self.hot_index = {}
        for table in self.hot_tables:
            spec = self.plan.tables[table]
            values = initial_table_rows(self.seed, table, spec.rows, spec.dim, self.hot_rows[table], self.table_init_bound(table))
            variable = self.add_weight(name=f"hot_rows_t{table}", shape=values.shape, dtype="float32",
                                       initializer=lambda shape, dtype, v=values: tf.constant(v), autocast=False)
            self.hot_index[table] = len(self.hot_variables)
            self.hot_variables.append(mark(variable, VariableKind.HOT))
        self.hot_counters = None
        if self.hot_tables:
            # [hot lookups, lookups, cold values sent, values the plain exchange would send, codes
            # sent] of this rank's owned entries, summed over every call (a lookup counted once: by
            # the slice holding column 0).
            self.hot_counters = self.add_weight(name="hot_row_counters", shape=(5,), dtype="int64",
                                                initializer="zeros", trainable=False)

    def _hot_ids(self, table: int) -> tf.Tensor:
        return tf.constant(np.asarray(self.hot_rows[table], np.int64))

    def _hot_row_lookup(self, packed, global_ids, local_batch) -> tf.Tensor:
        """The exchange with hot rows: this rank's looked-up blocks (``packed``, one per group with
        entries) and ids in, ``[b, sum_s W_s]`` out."""
        mine, counts = [], []
        for rows, f, _, piece, _ in self._entry_blocks(packed):
            band = self.plan.row_range(piece) if piece.table in self.row_sliced else None
            if piece.table in self.hot_index or band is not None:
                hot = self._hot_ids(piece.table) if piece.table in self.hot_index else None
                codes = hot_codes(global_ids[f], hot, band)
            else:  # every sample cold: one code per pooled row (a multi-hot feature has several ids per row)
                codes = -tf.ones(tf.shape(rows)[:1], tf.int32)
            mine.append((rows, codes))
            counts.append(self._traffic_counts(codes, piece.width, piece.column_start == 0))
        sources = []
        for rank in range(self.plan.world_size):
            entries = []
            for _, slices in packing_groups(self.plan, rank):
                for _, p in group_entries(slices, self.feature_tables):
                    piece = slices[p]
                    hot = self.hot_variables[self.hot_index[piece.table]].value if piece.table in self.hot_index else None
                    entries.append((hot, piece.column_start, piece.column_end, piece.table in self.row_sliced))
            sources.append(entries)
        if counts:
            self.hot_counters.assign_add(tf.add_n(counts))
        padding = self.padding_variables[0] if self.padding_variables and not mine else None
        return hot_row_exchange(self.env, local_batch, mine, sources, f"{self.name}_hot", padding=padding)

    def _traffic_counts(self, codes, width: int, first_slice: bool) -> tf.Tensor:
        """``[hot lookups, lookups, cold values sent, plain values, codes sent]`` of one entry's global batch."""
        world = self.plan.world_size
        per_destination = tf.reshape(codes, [world, -1])
        others = tf.constant([r != self.env.rank for r in range(world)])
        cold = tf.reduce_sum(tf.cast(per_destination < 0, tf.int64), axis=1)
        sent = tf.reduce_sum(tf.where(others, cold, tf.zeros_like(cold))) * width
        # A row band counts the lookups of its own rows (the others are another band's).
        lookups = tf.reduce_sum(tf.cast(codes != OUTSIDE, tf.int64)) if first_slice else tf.constant(0, tf.int64)
        hot = tf.reduce_sum(tf.cast(codes >= 0, tf.int64)) if first_slice else tf.constant(0, tf.int64)
        local = tf.size(per_destination[0], out_type=tf.int64)
        return tf.stack([hot, lookups, sent, local * (world - 1) * width, local * (world - 1)])

    def hot_row_traffic(self) -> list[dict] | None:
        """Collective: every rank's hot-row counters since the start (training and evaluation calls):
        ``[{"rank", "hot_lookups", "lookups", "hit_rate", "cold_values_sent", "plain_values",
        "sent_ratio", "codes_sent"}]``, ``sent_ratio`` = forward bytes sent (cold rows + int32 codes)
        over what the plain exchange sends (None without hot rows)."""
        if not self.hot_tables:
            return None
        gathered = collectives.allgather(self.env, tf.reshape(self.hot_counters.value, [1, 5])).numpy()
        return [{"rank": rank, "hot_lookups": int(h), "lookups": int(n), "hit_rate": round(h / n, 4) if n else None,
                 "cold_values_sent": int(v), "plain_values": int(p), "codes_sent": int(c),
                 "sent_ratio": round((v + c) / p, 4) if p else None}
                for rank, (h, n, v, p, c) in enumerate(gathered)]

    # ------------------------------------------------------------------ whole tables

    def _overlay_hot_rows(self, table: int, full: np.ndarray, state_of) -> None:
        """Writes the replicas (or their optimizer state) over the owner's stale copies in ``full``."""
        if table in self.hot_index:
            full[np.asarray(self.hot_rows[table])] = state_of(self.hot_variables[self.hot_index[table]]).numpy()

    def _set_hot_rows(self, table: int, values, state_of, dim: int) -> None:
        """Collective: every rank's replica (or its state) of ``table`` from rank 0's full ``values``."""
        if table not in self.hot_index:
            return
        ids = np.asarray(self.hot_rows[table])
        rows = np.asarray(values, np.float32)[ids] if self.env.is_chief else np.zeros((ids.size, dim), np.float32)
        rows = collectives.broadcast(self.env, tf.constant(rows), name=f"{self.name}_set_hot_rows_{table}")
        target = state_of(self.hot_variables[self.hot_index[table]])
        (target if isinstance(target, tf.Variable) else target.value).assign(rows)
