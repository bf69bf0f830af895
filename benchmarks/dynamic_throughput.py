r"""Training throughput of dynamic tables against fixed tables of the same size, in one run.

    python benchmarks/dynamic_throughput.py [--config=criteo_capped] [--windows=5] [--window_steps=5]

Both models are DLRM of the config's shape (``criteo_capped``: 26 tables capped at 100k rows, dim
128, NVIDIA's MLPs, batch 2048), trained with sparse SGD on the embeddings and SGD on the MLPs on the
same batches (ids Zipf-distributed over each table's rows; the dynamic model takes them as raw
int64 keys, its capacity equal to the fixed table's rows). After warm-up steps (which insert the
batches' keys into the dynamic tables) the cases take turns, one window each per round.

Cases (one JSON line each, ``"benchmark": "dynamic_throughput"``):

- ``fixed``, ``dynamic``: samples/s (median, min, max over windows); ``dynamic`` carries
  ``vs_fixed``, the ratio of medians (goal >= 0.7);
- ``dynamic_insert``: every key of every step new (fresh random 64-bit keys) while the tables have
  free rows; ``dynamic_insert_evict``: the same into full tables evicting by LRU. Both report
  ``step_ms`` and ``vs_dynamic`` (ratio of step times to the steady ``dynamic`` step);
- ``memory``: bytes per rank of the fixed tables, and of the dynamic tables' row storage, row
  metadata (occupied flag, key, last use, use count) and key map payload (16 bytes per key;
  the hash map's own node overhead comes on top).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPOSITORY)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from emit import emit  # noqa: E402
from train_throughput import CONFIGS, summarize  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="criteo_capped", choices=sorted(CONFIGS))
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--window_steps", type=int, default=5)
    parser.add_argument("--warmup_steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from tf_dlrm.parallel.env import DistributedEnv
    from tf_dlrm.embedding import DistributedEmbedding
    from tf_dlrm.embedding.table_config import DynamicStorage, FeatureConfig, Placement, TableConfig
    from tf_dlrm.spec.feature_spec import FeatureSpec
    from tf_dlrm.spec.format import NUMERICAL_CHANNEL
    from tf_dlrm.models.dlrm import DLRM
    from tf_dlrm.cli import builder
    from tf_dlrm.cli.model_config import ModelConfig, ShardingConfig
    from tf_dlrm.models.dlrm import DLRMConfig
    from tf_dlrm.optimizers.settings import LearningRateSchedule
    from tf_dlrm.optimizers.settings import OptimizerConfig
    from tf_dlrm.train.step import Trainer

    config = CONFIGS[args.config]
    spec = FeatureSpec.load(os.path.join(REPOSITORY, config.feature_spec), check_files=False)
    env = DistributedEnv()
    model_config = ModelConfig(config.embedding_dim, params=DLRMConfig(config.bottom_mlp_dims, config.top_mlp_dims))
    plan = builder.make_sharding_plan(spec, model_config, ShardingConfig(), 1)
    fixed = builder.build_model(spec, plan, model_config, env, seed=1)
    cardinalities = spec.cardinalities()
    names = spec.categorical_features
    # One dynamic table per feature, its capacity the fixed table's rows (the layer keeps them in its inner
    # tf_dlrm.embedding.dynamic.layer.DynamicEmbedding, whose rows and counters are measured below).
    features = [FeatureConfig(name, TableConfig(name, rows, config.embedding_dim,
                                                placement=Placement(dynamic=DynamicStorage(capacity=rows, eviction="lru"))))
                for name, rows in zip(names, cardinalities)]
    num_numerical = len(spec.numerical_features)
    dynamic = DLRM(DistributedEmbedding(features, seed=1, env=env, name="embedding"), num_numerical=num_numerical,
                   bottom_mlp_dims=config.bottom_mlp_dims, top_mlp_dims=config.top_mlp_dims, seed=1)
    builder.build_with_dummy_batch(dynamic, num_numerical, dynamic.embedding, 1)
    inner = dynamic.embedding.dynamic_layer
    optimizer = OptimizerConfig(LearningRateSchedule(0.01), optimizer="sgd", embedding_optimizer="sgd")
    trainers = {"fixed": Trainer(fixed, env, optimizer), "dynamic": Trainer(dynamic, env, optimizer)}

    rng = np.random.default_rng(0)
    size = config.batch_size

    def batch(new_keys: bool = False):
        numerical = rng.random((size, num_numerical), dtype=np.float32)
        if new_keys:
            ids = [rng.integers(-2**63, 2**63 - 1, size, dtype=np.int64) for _ in cardinalities]
        else:
            ids = [((rng.zipf(1.2, size) - 1) % rows).astype(np.int64) for rows in cardinalities]
        label = rng.integers(0, 2, (size, 1)).astype(np.float32)
        return {NUMERICAL_CHANNEL: tf.constant(numerical), **{name: tf.constant(i) for name, i in zip(names, ids)}}, tf.constant(label)

    batches = [batch() for _ in range(8)]

    def fixed_inputs(b):
        inputs, label = b
        return {name: ids if name == NUMERICAL_CHANNEL else tf.cast(ids, tf.int32) for name, ids in inputs.items()}, label

    def run(name, count, source):
        started = time.perf_counter()
        for step in range(count):
            b = source(step)
            trainers[name].train_step(*(fixed_inputs(b) if name == "fixed" else b)).numpy()
        return time.perf_counter() - started

    for name in trainers:
        run(name, args.warmup_steps + len(batches), lambda s: batches[s % len(batches)])
    rates = {name: [] for name in trainers}
    for _ in range(args.windows):
        for name in trainers:
            seconds = run(name, args.window_steps, lambda s: batches[s % len(batches)])
            rates[name].append(size * args.window_steps / seconds)
    fixed_rate, dynamic_rate = statistics.median(rates["fixed"]), statistics.median(rates["dynamic"])
    common = {"benchmark": "dynamic_throughput", "config": args.config, "precision": "fp32", "xla": False, "world_size": 1,
              "batch_size": size}
    emit({**common, "case": "fixed", "impl": "tf_dlrm", "samples_per_s": summarize(rates["fixed"])})
    emit({**common, "case": "dynamic", "impl": "tf_dlrm", "samples_per_s": summarize(rates["dynamic"]),
          "vs_fixed": round(dynamic_rate / fixed_rate, 3)})

    steady_ms = 1000.0 * size / dynamic_rate
    new_batches = [batch(new_keys=True) for _ in range(args.windows * args.window_steps)]
    insert_ms = [1000.0 * run("dynamic", 1, lambda s, b=b: b) for b in new_batches]
    rows_after = sum(c["rows"] for c in inner.counters().values())
    emit({**common, "case": "dynamic_insert", "impl": "tf_dlrm", "step_ms": summarize(insert_ms),
          "vs_dynamic": round(statistics.median(insert_ms) / steady_ms, 3), "new_keys_per_step": size * len(features),
          "rows_after": rows_after})
    # Fill every table to capacity (keys 0..rows-1 already there, more raw keys after them), then insert.
    for index, rows in enumerate(cardinalities):
        state = inner.states[0][index]
        state.load(np.arange(rows, dtype=np.int64) + (1 << 40), np.zeros(rows, np.int64), np.zeros(rows, np.int64))
    evict_ms = [1000.0 * run("dynamic", 1, lambda s, b=b: b) for b in new_batches]
    evictions = sum(c["evictions"] for c in inner.counters().values())
    emit({**common, "case": "dynamic_insert_evict", "impl": "tf_dlrm", "step_ms": summarize(evict_ms),
          "vs_dynamic": round(statistics.median(evict_ms) / steady_ms, 3), "evictions": evictions})

    fixed_bytes = sum(int(np.prod(v.shape)) * 4 for v in fixed.embedding.sparse_variables + fixed.embedding.dense_variables)
    storage = sum(int(np.prod(v.shape)) * 4 for v in inner.sparse_variables)
    capacity = sum(s.capacity for states in inner.states.values() for s in states)
    metadata = capacity * (1 + 3 * 8)
    keys = sum(int(s.map.size().numpy()) for states in inner.states.values() for s in states)
    emit({**common, "case": "memory", "impl": "tf_dlrm", "fixed_table_bytes": fixed_bytes, "dynamic_storage_bytes": storage,
          "dynamic_metadata_bytes": metadata, "dynamic_key_map_payload_bytes": keys * 16,
          "dynamic_vs_fixed": round((storage + metadata + keys * 16) / fixed_bytes, 4)})


if __name__ == "__main__":
    main()
