"""Run under horovodrun: hot-row replicas with bounded staleness (``--hot_row_sync_every``).

Usage: ``horovodrun -np N python tests/embedding/hot_row_sync_worker.py CASES.json OUT_DIR``; every
rank writes one record per case to ``OUT_DIR/rank<r>.json``. Cases (``kind``):

- ``exact_vs_merge``: SGD; a trainer combining the hot rows' gradients every step (the exact path)
  and one merging local updates after every step (:class:`HotRowSync` with ``S = 1``), from the same
  initial weights on the same batches: hot replicas, tables and MLP weights compared.
- ``reference``: SGD with ``S`` = the case's ``every``: before each step this rank's own gradient of
  its replicas is measured (a tape over the same forward pass), and numpy sums ``-lr / N * g`` over
  steps; after ``S`` steps the merged replicas are compared with ``base + sum over ranks`` of those
  deltas, replicas must differ between ranks before the merge and be identical after it.
- ``state_merge``: a stateful optimizer, no scheduled merge: after ``steps`` local steps, every rank's
  replicas and optimizer state are gathered, then merged (:meth:`Trainer.synchronize_hot_rows`): each
  must equal ``base + sum over ranks of (local - base)`` computed in numpy, on every rank.
- ``checkpoint``: ``main.py``'s session (the case's flags, ``--hot_row_sync_every``): ``steps`` < S
  steps, then a checkpoint save: the saved tables' hot rows equal every rank's replicas.
"""

from __future__ import annotations

import os

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

from tests.embedding.equivalence_worker import local_inputs, make_batches, make_model  # noqa: E402
from tf_dlrm.parallel import collectives  # noqa: E402
from tf_dlrm.optimizers.settings import LearningRateSchedule  # noqa: E402
from tf_dlrm.optimizers.settings import OptimizerConfig  # noqa: E402
from tf_dlrm.train.step import Trainer, binary_cross_entropy


def make_trainer(case, env, every):
    _, model = make_model(case, env)  # no one-process reference: this worker never reads it
    config = OptimizerConfig(LearningRateSchedule(case["learning_rate"]), optimizer="sgd",
                             embedding_optimizer=case.get("embedding_optimizer", "sgd"), adam_epsilon=1e-4)
    trainer = Trainer(model, env, config, hot_row_sync_every=every)
    trainer.broadcast_initial_state()
    return model, trainer


def gathered(env, tensor) -> np.ndarray:
    """``[N, ...]``: every rank's ``tensor``."""
    tensor = tf.convert_to_tensor(tensor)
    return collectives.allgather(env, tf.expand_dims(tensor, 0)).numpy()


def spread(values: np.ndarray) -> float:
    """Largest difference between ranks of gathered values ``[N, ...]``."""
    return float(np.abs(values - values[:1]).max(initial=0.0))


def parts(trainer, index):
    return [trainer.hot[index].value] + trainer.hot_sync.states[index]


def exact_vs_merge(case, env):
    model, exact = make_trainer(case, env, 1)
    merging_model, merging = make_trainer(case, env, 1)
    merging.hot_sync = merging.make_hot_row_sync(1)  # the merge path at S = 1 (training uses the exact one)
    record = {"initial_mlp": max(float(np.abs(a.numpy() - b.numpy()).max()) for a, b in zip(exact.mlp, merging.mlp))}
    for batch in make_batches(case, case["steps"]):
        exact.train_step(*local_inputs(batch, model, env))
        merging.train_step(*local_inputs(batch, merging_model, env))
    record["hot"] = max(float(np.abs(a.numpy() - b.numpy()).max()) for a, b in zip(exact.hot, merging.hot))
    record["hot_scale"] = max(float(np.abs(a.numpy()).max()) for a in exact.hot)
    record["tables"] = 0.0
    for table in range(len(case["cardinalities"])):  # collective; the full tables come back on rank 0
        exact_table, merged_table = model.embedding.get_full_table(table), merging_model.embedding.get_full_table(table)
        if exact_table is not None:
            record["tables"] = max(record["tables"], float(np.abs(exact_table - merged_table).max()))
    record["mlp"] = max(float(np.abs(a.numpy() - b.numpy()).max()) for a, b in zip(exact.mlp, merging.mlp))
    record["ranks_spread"] = max(spread(gathered(env, v.value)) for v in merging.hot)
    record["merges"] = int(merging.hot_sync.merges.numpy())
    return record


def reference(case, env):
    every = case["every"]
    model, trainer = make_trainer(case, env, every)
    base = [v.numpy().copy() for v in trainer.hot]
    deltas = [np.zeros_like(b) for b in base]
    record = {"drift_before_merge": [], "steps_since_merge": [], "merges": []}
    for step, batch in enumerate(make_batches(case, case["steps"]), start=1):
        features, label = local_inputs(batch, model, env)
        with tf.GradientTape() as tape:
            tape.watch([v.value for v in trainer.hot])
            loss = binary_cross_entropy(label, model(features, training=True))
        gradients = tape.gradient(loss, [v.value for v in trainer.hot])
        trainer.train_step(features, label)
        rate = np.float32(float(trainer.learning_rate.numpy()) * trainer.config.embedding_rate_factor / env.world_size)
        for delta, gradient in zip(deltas, gradients):
            delta -= rate * tf.convert_to_tensor(gradient).numpy()
        since = int(trainer.hot_sync.steps_since_merge.numpy())
        record["steps_since_merge"].append(since)
        record["merges"].append(int(trainer.hot_sync.merges.numpy()))
        if since:  # between merges: the replicas drift apart
            record["drift_before_merge"].append(max(spread(gathered(env, v.value)) for v in trainer.hot))
    assert case["steps"] % every == 0, "the case ends on a merge"
    expected = [b + gathered(env, d).sum(axis=0, dtype=np.float32) for b, d in zip(base, deltas)]
    record["merged_vs_reference"] = max(float(np.abs(v.numpy() - e).max()) for v, e in zip(trainer.hot, expected))
    record["moved"] = max(float(np.abs(v.numpy() - b).max()) for v, b in zip(trainer.hot, base))
    record["ranks_spread"] = max(spread(gathered(env, v.value)) for v in trainer.hot)
    record["bytes_sent"] = int(trainer.hot_gradient_bytes_sent.numpy())
    return record


def state_merge(case, env):
    model, trainer = make_trainer(case, env, 10_000)
    for batch in make_batches(case, case["steps"]):
        trainer.train_step(*local_inputs(batch, model, env))
    sync = trainer.hot_sync
    expected, drift = [], 0.0
    for index in range(len(trainer.hot)):
        for part, base in zip(parts(trainer, index), sync.bases[index]):
            local = gathered(env, part)  # [N, H, w]
            drift = max(drift, spread(local))
            base = base.numpy()
            total = np.zeros_like(base)
            for rank in range(env.world_size):  # rank order, float32, as the merge adds them
                total += local[rank] - base
            expected.append(base + total)
    trainer.synchronize_hot_rows()
    actual = [tf.convert_to_tensor(p).numpy() for index in range(len(trainer.hot)) for p in parts(trainer, index)]
    return {
        "drift_before_merge": drift,
        "state_variables": sum(len(s) for s in sync.states),
        "merged_vs_reference": max(float(np.abs(a - e).max()) for a, e in zip(actual, expected)),
        "ranks_spread": max(spread(gathered(env, a)) for a in actual),
        "bases_equal_replicas": max(float(np.abs(tf.convert_to_tensor(p).numpy() - b.numpy()).max())
                                    for index in range(len(trainer.hot)) for p, b in zip(parts(trainer, index), sync.bases[index])),
        "steps_since_merge": int(sync.steps_since_merge.numpy()),
    }


def checkpoint(case, env):
    from tests.checkpoint.checkpoint_worker import parse
    from tf_dlrm.cli import builder, modes
    from tf_dlrm.checkpoint.slices import read_table
    from tf_dlrm.checkpoint.store import read_manifest

    from tf_dlrm.spec.feature_spec import FeatureSpec
    from tf_dlrm.train.reporting import Reporter
    from tf_dlrm.cli.session import resolve_spec_path

    config = parse(case["argv"])
    config.check_world_size(env.world_size)
    # modes.start without configure_threads: this process set its threads already (case_runs).
    started = (env, FeatureSpec.load(resolve_spec_path(config)), Reporter(env.is_chief, None, None), (1, 1))
    session = modes.open_session(config, started)
    trainer, embedding = session.trainer, session.model.embedding
    reader = builder.make_reader(session.spec, config.train_split, config.batch_size, env, session.model.input_modes, True,
                                 config.seed)
    for features, label in reader.dataset(epoch=0).take(case["steps"]):
        trainer.train_step(features, label)
    drift = max(spread(gathered(env, v.value)) for v in trainer.hot)
    pending = int(trainer.hot_sync.steps_since_merge.numpy())
    path = session.checkpointer.save(case["steps"])
    saved_vs_replica = 0.0
    manifest = read_manifest(path)
    for table, index in embedding.hot_index.items():
        saved = read_table(path, manifest["tables"][table])[np.asarray(embedding.hot_rows[table])]
        saved_vs_replica = max(saved_vs_replica, float(np.abs(saved - trainer.hot[index].numpy()).max()))
    return {"drift_before_save": drift, "pending_steps_before_save": pending, "saved_vs_replica": saved_vs_replica,
            "hot_tables": len(embedding.hot_index), "steps_since_merge": int(trainer.hot_sync.steps_since_merge.numpy()),
            "ranks_spread": max(spread(gathered(env, v.value)) for v in trainer.hot)}


KINDS = {"exact_vs_merge": exact_vs_merge, "reference": reference, "state_merge": state_merge, "checkpoint": checkpoint}


def run_case(case, env):
    return {"case": case["name"], "rank": env.rank, **KINDS[case["kind"]](case, env)}


if __name__ == "__main__":
    from tests.case_runs import run_cases_on_this_rank

    run_cases_on_this_rank(run_case)
