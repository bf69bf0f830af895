"""Save at N ranks, restore at M, continue; or train uninterrupted (issue #16 checkpoints).

Usage: ``[horovodrun -np N] python tests/embedding/dynamic/dynamic_checkpoint_worker.py MODE CASE.json DIR``

- ``save``: trains ``first_steps`` steps, saves the dynamic tables (``DIR/dynamic``) and the dense
  state (``DIR/dense.npz``: MLP weights, dense optimizer variables, trainer step) from rank 0;
- ``resume``: restores both, trains ``second_steps`` more steps, writes ``DIR/result.npz``;
- ``uninterrupted``: trains all steps in one go, writes ``DIR/result.npz``.

``result.npz`` (rank 0): every live key of every table with its row and optimizer state (gathered,
sorted by key), the MLP weights and the logits of an evaluation batch.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dynamic_equivalence_worker import local, make_batches, make_model  # noqa: E402

from tf_dlrm.parallel import collectives  # noqa: E402
from tf_dlrm.parallel import env as env_module  # noqa: E402
from tf_dlrm.checkpoint import dynamic_tables as checkpoint  # noqa: E402
from tf_dlrm.optimizers.settings import LearningRateSchedule  # noqa: E402
from tf_dlrm.optimizers.settings import OptimizerConfig  # noqa: E402
from tf_dlrm.train.step import Trainer


def gathered_rows(env, model, trainer) -> dict:
    result = {}
    getters = {"values": None, **{f"slot_{n}": (lambda v, n=n: trainer.sparse.slot(v, n)) for n in trainer.sparse.slot_names}}
    layer = model.embedding.dynamic_layer
    for table in range(len(layer.table_configs)):
        for field, state_of in getters.items():
            keys, values = layer.local_rows(table, state_of)
            keys = collectives.allgather(env, tf.constant(keys, tf.int64), name=f"ck_{table}_{field}").numpy()
            values = collectives.allgather(env, tf.constant(values, tf.float32), name=f"cv_{table}_{field}").numpy()
            order = np.argsort(keys)
            result[f"t{table}_keys"], result[f"t{table}_{field}"] = keys[order], values[order]
    return result


def main():
    mode, case_path, directory = sys.argv[1], sys.argv[2], sys.argv[3]
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    env = env_module.initialize()
    with open(case_path) as handle:
        case = json.load(handle)
    model = make_model(case, env, None)
    total = case["first_steps"] + case["second_steps"]
    batches = make_batches(case, total + 1)
    model(local(batches[0], env)[0])
    config = OptimizerConfig(LearningRateSchedule(case["learning_rate"]), optimizer="adam",
                             embedding_optimizer=case["embedding_optimizer"], dense_learning_rate=0.01,
                             adam_epsilon=case.get("adam_epsilon", 1e-8))
    trainer = Trainer(model, env, config)
    trainer.broadcast_initial_state()
    dense = list(trainer.mlp) + list(trainer.dense_optimizer.variables) + [trainer.step]
    if mode == "save":
        steps = range(case["first_steps"])
    elif mode == "resume":
        checkpoint.restore_rows(os.path.join(directory, "dynamic"), model.embedding.dynamic_layer, trainer.sparse, env)
        saved = np.load(os.path.join(directory, "dense.npz"))
        for index, variable in enumerate(dense):
            variable.assign(saved[f"v{index}"])
        steps = range(case["first_steps"], total)
    else:
        steps = range(total)
    for step in steps:
        trainer.train_step(*local(batches[step], env))
    if mode == "save":
        checkpoint.save_rows(os.path.join(directory, "dynamic"), model.embedding.dynamic_layer, trainer.sparse, env)
        if env.is_chief:
            np.savez(os.path.join(directory, "dense.npz"), **{f"v{i}": v.numpy() for i, v in enumerate(dense)})
        return
    result = gathered_rows(env, model, trainer)
    features, _ = local(batches[-1], env)
    result["logits"] = collectives.allgather(env, model(features, training=False), name="logits").numpy()
    for index, variable in enumerate(trainer.mlp):
        result[f"mlp{index}"] = variable.numpy()
    if env.is_chief:
        np.savez(os.path.join(directory, "result.npz"), **result)


if __name__ == "__main__":
    main()
