"""Under horovodrun: bfloat16_mean against the float64 mean of every rank's tensors (all ranks
build all ranks' tensors from one seed), written to OUT_DIR/rank<r>.json."""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tf_dlrm.parallel import env as env_module  # noqa: E402
from tf_dlrm.parallel.compressed_mean import bfloat16_mean  # noqa: E402

env = env_module.initialize(force_horovod=True)
shapes = [(7, 5), (5,), (3, 4, 2), (1,)]
rng = np.random.default_rng(11)
every = [[rng.normal(scale=10.0 ** rng.integers(-6, 2), size=s).astype(np.float32) for s in shapes] for _ in range(env.world_size)]
out = bfloat16_mean(env, [tf.constant(t) for t in every[env.rank]], "test_mean")
worst = 0.0
for index, tensor in enumerate(out):
    assert tensor.shape == shapes[index] and tensor.dtype == tf.float32
    exact = np.mean([np.float64(r[index]) for r in every], axis=0)
    scale = np.mean([np.abs(np.float64(r[index])) for r in every], axis=0)
    worst = max(worst, float((np.abs(tensor.numpy() - exact) / np.maximum(scale, 1e-300)).max()))
with open(os.path.join(sys.argv[1], f"rank{env.rank}.json"), "w") as handle:
    json.dump({"rank": env.rank, "worst_relative": worst, "values": [t.numpy().tolist() for t in out]}, handle)
