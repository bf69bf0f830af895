"""Run under horovodrun: trains a tiny sharded DLRM; one rank fails mid-training.

``python failure_worker.py raise RANK``: that rank raises after 3 steps while the others go on
into their next collectives. ``python failure_worker.py hang``: every rank trains until killed
(the test SIGKILLs one). Each rank prints ``rank R step S`` as it goes.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402

from tf_dlrm.parallel import env as env_module  # noqa: E402
from tf_dlrm.sharding.plan import TableSpec  # noqa: E402
from tf_dlrm.sharding.planner import make_plan  # noqa: E402
from tf_dlrm.models.dlrm import DLRM  # noqa: E402
from tf_dlrm.cli.builder import build_with_dummy_batch  # noqa: E402
from tf_dlrm.optimizers.settings import LearningRateSchedule  # noqa: E402
from tf_dlrm.optimizers.settings import OptimizerConfig  # noqa: E402
from tf_dlrm.train.step import Trainer
from tests.plan_layer import plan_layer


def main():
    mode = sys.argv[1]
    failing_rank = int(sys.argv[2]) if len(sys.argv) > 2 else -1
    env = env_module.initialize(force_horovod=True)
    plan = make_plan([TableSpec(f"t{i}", 5000, 8) for i in range(3)], env.world_size, "column_wise")
    embedding = plan_layer(plan, rank=env.rank)
    model = DLRM(embedding, num_numerical=2, bottom_mlp_dims=[8], top_mlp_dims=[4, 1])
    build_with_dummy_batch(model, 2, embedding, env.world_size)
    trainer = Trainer(model, env, OptimizerConfig(LearningRateSchedule(0.1)))
    rng = np.random.default_rng(0)
    local, world = 32, env.world_size
    step = 0
    while mode == "hang" or step < 1000:
        ids = {name: rng.integers(0, 5000, local * world if where == "global" else local).astype(np.int32)
               for name, where in embedding.input_modes.items()}
        features = {"numerical": rng.random((local, 2), dtype=np.float32), **ids}
        trainer.train_step(features, np.ones((local, 1), np.float32))
        step += 1
        print(f"rank {env.rank} step {step}", flush=True)
        if mode == "raise" and env.rank == failing_rank and step == 3:
            raise RuntimeError(f"rank {env.rank} fails on purpose at step {step}")


if __name__ == "__main__":
    main()
