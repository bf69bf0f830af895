"""One rank of the step breakdown (run by ``benchmarks/step_breakdown.py`` under ``horovodrun``,
or as one of N plain processes with ``--independent=R/N``).

The training step of :class:`tf_dlrm.train.step.Trainer` is cut into the phases it runs, each
traced as its own ``tf.function`` from the trainer's own pieces, and each timed alone on every
rank, with a barrier before it (all ranks start together) and the time spent in a barrier after it
recorded as ``waiting`` (what the fastest rank loses to the slowest):

- ``input``: reading this rank's share of one global batch from the split_binary files;
- ``lookup``: ids checked and pooled lookups of the owned slices (global batch) and replicated tables;
- ``exchange``: the embedding alltoall of a block of this rank's send width, and its backward;
- ``dense_forward``: bottom MLP, interaction, top MLP and loss on the local batch;
- ``dense_backward``: the gradient of the dense part (``dense_forward_backward - dense_forward``);
- ``allreduce``: averaging the dense gradients over ranks (the trainer's ``_average_over_ranks``);
- ``update``: the sparse and dense optimizer updates;
- ``step``: the whole ``Trainer.train_step``, where the phases overlap on inter-op threads.

Writes ``OUT_DIR/rank<r>.json`` with every phase's per-step seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PHASES = ("input", "lookup", "exchange", "dense_forward", "dense_forward_backward", "allreduce", "update", "step")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spec")
    parser.add_argument("out_dir")
    parser.add_argument("config")
    parser.add_argument("--batch_size", type=int, default=0, help="global batch (0: the config's)")
    parser.add_argument("--steps", type=int, default=4, help="timed repetitions of every phase")
    parser.add_argument("--num_batches", type=int, default=2)
    parser.add_argument("--intra_op", type=int, default=0)
    parser.add_argument("--inter_op", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--independent", type=str, default="")
    args = parser.parse_args(argv)

    from scaling_worker import wait_for_all
    from train_throughput import CONFIGS, configure_threads, read_batch_features

    from tf_dlrm.parallel import collectives
    from tf_dlrm.cli import cycle_time
    from tf_dlrm.parallel import env as env_module

    cycle_line = None
    if args.independent:
        rank, count = (int(part) for part in args.independent.split("/"))
        env = env_module.DistributedEnv()
        intra, inter = configure_threads(args.intra_op, args.inter_op, count)
    else:
        # main.py's choice of Horovod's cycle time (HOROVOD_CYCLE_TIME in the environment wins, as it does there).
        config = CONFIGS[args.config]
        cycle_line = cycle_time.apply(None, config.bottom_mlp_dims, config.top_mlp_dims,
                                      args.batch_size or config.batch_size, env_module.launched_world_size())
        env = env_module.initialize(force_horovod=True)
        rank, count = env.rank, 1
        intra, inter = configure_threads(args.intra_op, args.inter_op, env.local_size)

    import tensorflow as tf

    from tf_dlrm.data.reader import SplitBinaryReader
    from tf_dlrm.embedding.pooling import pooled_lookup
    from tf_dlrm.spec.feature_spec import FeatureSpec
    from tf_dlrm.cli import builder
    from tf_dlrm.cli.model_config import ShardingConfig
    from tf_dlrm.optimizers.settings import LearningRateSchedule
    from tf_dlrm.optimizers.settings import OptimizerConfig
    from tf_dlrm.spec.format import NUMERICAL_CHANNEL
    from tf_dlrm.train.step import Trainer

    config = CONFIGS[args.config]
    global_batch = (args.batch_size or config.batch_size) // count
    spec = FeatureSpec.load(args.spec)
    model_config = config.model_config()  # the config's model (dlrm_dcnv2_capped: NVIDIA's DCNv2 cross layers)
    plan = builder.make_sharding_plan(spec, model_config, ShardingConfig(), env.world_size)
    model = builder.build_model(spec, plan, model_config, env, args.seed)
    trainer = Trainer(model, env, OptimizerConfig(LearningRateSchedule(0.05)))
    trainer.broadcast_initial_state()
    embedding = model.embedding
    reader = SplitBinaryReader(spec, "train", global_batch, rank=env.rank, world_size=env.world_size,
                               input_modes=model.input_modes)

    def read(index):
        return read_batch_features(reader, spec, index % reader.num_batches)

    batches = [read(i) for i in range(args.num_batches)]
    local_batch = global_batch // env.world_size

    @tf.function
    def lookup(features):
        # The features this rank looks up: the global ones (owned slices), then the local ones (replicated tables).
        order = list(embedding.global_categorical) + list(embedding.local_categorical)
        ids = embedding._normalized(order, [features[embedding.features[f].name] for f in order])
        parts = [pooled_lookup(v, [(ids[f], o[p], embedding.features[f].combiner) for f, p in e], tf.as_dtype(o.dtype))
                 for v, o, e in zip(embedding.shard_variables, embedding.group_offsets, embedding.entries) if e]
        parts += [pooled_lookup(v, [(ids[f], o[p], embedding.features[f].combiner) for f, p in e], tf.as_dtype(o.dtype))
                  for v, o, e in zip(embedding.replicated_variables, embedding.replicated_offsets, embedding.replicated_entries)]
        return parts  # the owned slices for the global batch, the replicated tables for the local one

    send = tf.zeros([global_batch * embedding.send_widths[env.rank]], tf.float32)

    @tf.function
    def exchange(flat):
        received = collectives.alltoall(env, flat, name="breakdown_exchange")
        splits = [local_batch * w for w in embedding.send_widths]
        return collectives.alltoall(env, received, splits if env.distributed else None, name="breakdown_exchange_back")

    @tf.function
    def embeddings_of(features):
        return embedding(features, local_batch=local_batch, stacked=True)  # what dense_call takes

    @tf.function
    def dense_forward(numerical, embeddings, label):
        return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=model.dense_call(numerical, embeddings)))

    @tf.function
    def dense_forward_backward(numerical, embeddings, label):
        mlp = [v.value for v in trainer.mlp]
        with tf.GradientTape() as tape:
            tape.watch([embeddings] + mlp)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=model.dense_call(numerical, embeddings)))
        return loss, tape.gradient(loss, [embeddings] + mlp)

    @tf.function
    def gradients(features, label):
        loss, _, tables, mlp = trainer._gradients(features, label, None)
        shards = tables[:len(trainer.shards)]
        replicated = [trainer.sparse.pack_replicated(g, v) for g, v in
                      zip(tables[len(trainer.shards):len(trainer.shards) + len(trainer.replicated)], trainer.replicated)]
        return shards, replicated + list(mlp) + ([tf.zeros([])] if env.distributed else [])

    @tf.function
    def allreduce(dense):
        return trainer._average_over_ranks(dense)

    @tf.function
    def update(shards, dense):
        replicated = dense[:len(trainer.replicated)]
        trainer.sparse.apply(shards, replicated, 0.05, trainer.step + 1, global_batch)
        for variable, gradient in zip(trainer.mlp, dense[len(trainer.replicated):len(trainer.replicated) + len(trainer.mlp)]):
            tf.raw_ops.ResourceApplyGradientDescent(var=variable.value.handle, alpha=tf.constant(0.05, gradient.dtype), delta=gradient)
        return tf.constant(0)

    prepared = []
    for features, label in batches:
        shards, dense = gradients(features, label)
        prepared.append((embeddings_of(features), shards, dense))

    def phase_call(name, index):
        features, label = batches[index % len(batches)]
        numerical = features[NUMERICAL_CHANNEL]
        embeddings, shards, dense = prepared[index % len(prepared)]
        if name == "input":
            return read(index)
        if name == "lookup":
            return lookup(features)
        if name == "exchange":
            return exchange(send)
        if name == "dense_forward":
            return dense_forward(numerical, embeddings, label)
        if name == "dense_forward_backward":
            return dense_forward_backward(numerical, embeddings, label)
        if name == "allreduce":
            return allreduce(dense)
        if name == "update":
            return update(shards, dense)
        return trainer.train_step(features, label)

    def finish(result):
        tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, result)

    for name in PHASES:  # trace and warm every function
        finish(phase_call(name, 0))
    if args.independent:
        wait_for_all(args.out_dir, rank, count)
    seconds = {name: [] for name in PHASES}
    waiting = {name: [] for name in PHASES}
    for index in range(args.steps):
        for name in PHASES:
            collectives.barrier(env)
            started = time.perf_counter()
            finish(phase_call(name, index))
            done = time.perf_counter()
            collectives.barrier(env)
            seconds[name].append(done - started)
            waiting[name].append(time.perf_counter() - done)
    reader.close()
    record = {"rank": rank, "world_size": env.world_size, "independent_processes": count if args.independent else 0,
              "intra_op_threads": intra, "inter_op_threads": inter, "global_batch_size": global_batch * count,
              "seconds": seconds, "waiting": waiting, "allreduce_payload_bytes": trainer.allreduce_payload_bytes(),
              "send_widths": list(embedding.send_widths), "horovod_cycle_time": cycle_line}
    with open(os.path.join(args.out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump(record, handle)


if __name__ == "__main__":
    main()
