"""Under horovodrun: the deduplicated exchange against the plain one on the same rank, same plan and
seed: forward outputs (equal bit for bit) and the gradients of every shard (within float32 reordering
of the sums over duplicates), plus the values each sends. Writes OUT_DIR/<case>_rank<r>.json."""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tf_dlrm.parallel import env as env_module  # noqa: E402
from tf_dlrm.sharding.plan import TableSpec  # noqa: E402
from tf_dlrm.sharding.planner import make_plan  # noqa: E402
from tests.plan_layer import plan_layer  # noqa: E402

env = env_module.initialize(force_horovod=True)
tf.config.threading.set_intra_op_parallelism_threads(1)
out_dir = sys.argv[1]
for strategy in ("table_wise", "column_wise", "auto"):
    cardinalities = [40, 300, 500, 1000, 2000, 77]
    plan = make_plan([TableSpec(f"t{i}", rows, 8) for i, rows in enumerate(cardinalities)], env.world_size, strategy,
                     data_parallel_threshold=60)
    layers = [plan_layer(plan, rank=env.rank, seed=5, deduplicate_exchange=d, name=f"embedding_{d}") for d in (False, True)]
    global_batch = 12 * env.world_size
    rng = np.random.default_rng(7)
    # Few distinct ids per table: many duplicates in every destination's block.
    ids = [rng.integers(0, min(rows, 5), global_batch).astype(np.int32) for rows in cardinalities]
    local = global_batch // env.world_size
    mine = slice(env.rank * local, (env.rank + 1) * local)
    upstream = tf.constant(rng.normal(size=(local, len(cardinalities), 8)), tf.float32)
    results = []
    for layer in layers:
        modes = layer.input_modes
        names = [f.name for f in layer.features]
        categorical = {name: tf.constant(ids[t] if modes[name] == "global" else ids[t][mine])
                       for t, name in enumerate(names) if name in modes}
        layer(categorical, local_batch=local, stacked=True)

        @tf.function
        def step(categorical, layer=layer):
            with tf.GradientTape() as tape:
                output = layer(categorical, local_batch=local, stacked=True)
                loss = tf.reduce_sum(output * upstream)
            gradients = tape.gradient(loss, layer.shard_variables)
            return output, [tf.convert_to_tensor(g) for g in gradients]

        output, gradients = step(categorical)
        results.append((output.numpy(), [g.numpy() for g in gradients]))
    (plain_out, plain_grads), (dedup_out, dedup_grads) = results
    record = {"strategy": strategy, "rank": env.rank,
              "forward_equal": bool(np.array_equal(plain_out, dedup_out)),
              "gradient_max_abs": max([float(np.abs(a - b).max(initial=0.0)) for a, b in zip(plain_grads, dedup_grads)] + [0.0]),
              "gradient_scale": max([float(np.abs(a).max(initial=0.0)) for a in plain_grads] + [0.0])}
    with open(os.path.join(out_dir, f"{strategy}_rank{env.rank}.json"), "w") as handle:
        json.dump(record, handle)
