"""Grappler never merges two of tf_dlrm's allreduces (tf_dlrm.parallel.collectives._tag).

Horovod's ops are not marked stateful, so Grappler treats two allreduces of the same tensor as one
computation and keeps one of the two; which one depends on each rank's node order, and a rank
that kept the other name waits forever (a Wide & Deep training step at 3 ranks hung this way: two
biases adding to the logit have the same gradient). Checked here on the graph Grappler returns,
in one process (building Horovod ops needs no ``hvd.init``)."""

from __future__ import annotations

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2
from tensorflow.python.framework import ops as ops_lib
from tensorflow.python.grappler import tf_optimizer
from tensorflow.python.training import saver

from tf_dlrm.parallel import collectives
from tf_dlrm.parallel.env import DistributedEnv

TWO_RANKS = DistributedEnv(rank=0, world_size=2)


def collectives_after_grappler(build) -> list[str]:
    """Names of the Horovod ops left after Grappler's default passes, for a graph whose one fetch
    reads both results of ``build(x)``."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4], name="x")
        first, second = build(x)
        fetch = tf.identity(first * 2.0 + second * 3.0, name="fetch")
        graph.get_collection_ref(ops_lib.GraphKeys.TRAIN_OP).append(fetch)
        meta_graph = saver.export_meta_graph(graph_def=graph.as_graph_def(), graph=graph)
    optimized = tf_optimizer.OptimizeGraph(config_pb2.ConfigProto(), meta_graph)
    return sorted(node.name for node in optimized.node if node.op.startswith("Horovod"))


def bias_like_gradients(x):
    # Two gradients that are the same computation, as two biases feeding one logit have.
    return tf.reduce_sum(x)[None], tf.reduce_sum(x)[None]


def test_plain_horovod_allreduces_of_the_same_tensor_are_merged():
    import horovod.tensorflow as hvd

    def build(x):
        a, b = bias_like_gradients(x)
        return (hvd.grouped_allreduce([a], op=hvd.Average, name="dense_gradient_2")[0],
                hvd.grouped_allreduce([b], op=hvd.Average, name="dense_gradient_6")[0])

    assert len(collectives_after_grappler(build)) == 1  # the hazard the tags remove


def test_grouped_means_of_the_same_tensor_both_survive():
    def build(x):
        a, b = bias_like_gradients(x)
        return (collectives.grouped_mean(TWO_RANKS, [a], name="dense_gradient_2")[0],
                collectives.grouped_mean(TWO_RANKS, [b], name="dense_gradient_6")[0])

    assert len(collectives_after_grappler(build)) == 2


def test_sums_over_ranks_of_the_same_tensor_both_survive():
    def build(x):
        a, b = bias_like_gradients(x)
        return (collectives.sum_over_ranks(TWO_RANKS, a, name="first_sum"),
                collectives.sum_over_ranks(TWO_RANKS, b, name="second_sum"))

    assert len(collectives_after_grappler(build)) == 2
