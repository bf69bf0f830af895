"""The embedding of dynamic tables from a feature spec (``main.py`` builds it through
:func:`tf_dlrm.cli.builder.make_embedding` when the spec has ``dynamic: true`` features)."""

from __future__ import annotations

from tf_dlrm.parallel.env import DistributedEnv
from tf_dlrm.spec import dynamic as dynamic_spec
from tf_dlrm.embedding.dynamic.layer import DynamicEmbedding


def has_dynamic_tables(spec) -> bool:
    return bool(dynamic_spec.dynamic_features(spec))


def make_dynamic_embedding(spec, init_bound, env: DistributedEnv, seed: int, widths, num_shards: int | None = None
                           ) -> DynamicEmbedding:
    """The (unbuilt) embedding; ``init_bound``: ``--embedding_init``'s bound (None: 1/sqrt(rows));
    ``widths``: each table's width; ``num_shards``: shards of every table (default:
    the world size; export holds a checkpoint's shards in one process). Every categorical feature must be dynamic
    and one-hot (mixing fixed and dynamic tables in one model is not supported yet: the error names
    the fixed ones)."""
    names = spec.categorical_features
    fixed = [n for n in names if not dynamic_spec.is_dynamic(spec.feature_spec[n])]
    if fixed:
        raise ValueError(f"Expected every categorical feature to be dynamic, or none (mixed models are not supported "
                         f"yet). Received fixed features {fixed} beside dynamic ones")
    multi_hot = [n for n in names if spec.hotness(n) != 1]
    if multi_hot:
        raise ValueError(f"Expected one-hot dynamic features. Received: hotness > 1 for {multi_hot}")
    tables = [dynamic_spec.table_config(n, spec.feature_spec[n], w, init_bound) for n, w in zip(names, widths)]
    return DynamicEmbedding(tables, rank=env.rank, world_size=env.world_size, num_shards=num_shards, seed=seed, name="embedding")
