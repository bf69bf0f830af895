r"""Training throughput of a multi-hot DLRM: tf_dlrm against naive Keras, in one process.

    python benchmarks/multi_hot_throughput.py [--rows=20000] [--batch_size=2048] [--windows=5] [--window_steps=5]

The config: 26 categorical features with hotness 1 to 20 (feature i has ``1 + (i * 19) // 25`` ids,
half summed, half averaged), table widths 64, 96 or 128 (the ``cat`` interaction: the dot needs one
width), 13 numerical features, bottom MLP 256-64, top MLP 512-256-1, SGD, fp32, ids uniform in
``[0, --rows)``. Both implementations train on the same in-memory batches; the cases take turns
window by window so that machine load hits them alike. Cases:

- ``naive_sparse``: 26 ``keras.layers.Embedding`` weights read with ``tf.nn.safe_embedding_lookup_sparse``
  (the ids as a ``tf.SparseTensor``), Keras SGD on every variable;
- ``naive_ragged``: the same with ``tf.gather`` on a ``tf.RaggedTensor`` of ids and ``reduce_sum`` /
  ``reduce_mean`` over the ragged axis;
- ``tf_dlrm``: :class:`tf_dlrm.embedding.DistributedEmbedding` (tables fused by width)
  in tf_dlrm's DLRM and Trainer, the same SGD. With tf_dlrm's kernel library built (the default
  install) one embedding-bag op pools all 26 features without gathering rows into a new tensor, its
  gradient is one ``IndexedSlices`` per fused variable over the distinct rows, and SGD updates those
  rows on all threads (tf_dlrm/ops/embedding_bag.cc); without it (``TF_DLRM_DISABLE_KERNELS=1``) per
  feature one ``unique``, one gather of its distinct rows and one sparse segment sum.
  Only when asked for (``--cases``): ``tf_dlrm_ragged``, each multi-hot feature's rows of 1 to
  ``2 * hotness - 1`` ids (``hotness`` on average, the fixed case's ids per row) as ragged inputs;
  ``tf_dlrm_unchecked`` without the id checks;
  ``tf_dlrm_without_kernel`` with plain TensorFlow pooling (``use_kernel=False``); ``tf_dlrm_lazy_adam``
  and ``tf_dlrm_lazy_adam_without_kernel`` with the trainer's default embedding optimizer (lazy Adam,
  whose update uses tf_dlrm's kernel in both when it is built; the naive cases keep SGD, so compare
  these two with each other only).

Prints one JSON line per case (``vs_naive_sparse`` / ``vs_naive_ragged``: ratios of medians), then
one line ``{"benchmark": "multi_hot_alltoall_bytes", ...}`` with the embedding alltoall bytes per
step of this config and of the same tables one-hot, from the sharding plan, for 2 and 8 ranks:
pooling on the owner makes them equal.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

NUM_FEATURES, NUM_NUMERICAL = 26, 13
BOTTOM, TOP = (256, 64), (512, 256, 1)


def hotness(feature: int) -> int:
    return 1 + (feature * 19) // (NUM_FEATURES - 1)


def width(feature: int) -> int:
    return (64, 96, 128)[feature % 3]


def combiner(feature: int) -> str:
    return "sum" if feature % 2 == 0 else "mean"


def feature_configs(rows: int, ragged: bool = False) -> list:
    """One table of ``rows`` rows per feature; ragged: multi-hot rows of 1 to 2 * hotness - 1 ids (see
    ragged_batches), the same mean."""
    from tf_dlrm.embedding import FeatureConfig, TableConfig

    features = []
    for f in range(NUM_FEATURES):
        table = TableConfig(f"f{f}", rows, width(f))
        if ragged and hotness(f) > 1:
            features.append(FeatureConfig(f"f{f}", table, hotness=2 * hotness(f) - 1, combiner=combiner(f), ragged=True))
        else:
            features.append(FeatureConfig(f"f{f}", table, hotness=hotness(f), combiner=combiner(f)))
    return features


def make_batches(count: int, batch_size: int, rows: int, seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(count):
        numerical = rng.random((batch_size, NUM_NUMERICAL), dtype=np.float32)
        ids = [rng.integers(0, rows, (batch_size, hotness(f))).astype(np.int32) for f in range(NUM_FEATURES)]
        label = rng.integers(0, 2, (batch_size, 1)).astype(np.float32)
        batches.append((numerical, ids, label))
    return batches


def ragged_batches(batches, seed: int):
    """``batches`` with each multi-hot feature's rows of 1 to ``2 * hotness - 1`` ids (a permuted
    cycle of those lengths: ``hotness`` ids a row on average, as the fixed case), as ``(ids, lengths)``."""
    import numpy as np

    rng = np.random.default_rng([seed, 1])
    out = []
    for numerical, ids, label in batches:
        features = []
        for f, fixed in enumerate(ids):
            h = hotness(f)
            if h == 1:
                features.append(fixed)
                continue
            lengths = rng.permutation(np.resize(np.arange(1, 2 * h, dtype=np.int64), fixed.shape[0]))
            values = rng.integers(0, int(fixed.max()) + 1, int(lengths.sum())).astype(np.int32)
            features.append((values, lengths))
        out.append((numerical, features, label))
    return out


def _as_tensor(ids):
    import tensorflow as tf

    if isinstance(ids, tuple):
        return tf.RaggedTensor.from_row_lengths(tf.constant(ids[0]), tf.constant(ids[1]))
    return tf.constant(ids)


def _features(numerical, ids) -> dict:
    """One batch as the dict of named features tf_dlrm's models take (feature ``f`` is named ``f<f>``)."""
    import tensorflow as tf

    from tf_dlrm.spec.format import NUMERICAL_CHANNEL

    return {NUMERICAL_CHANNEL: tf.constant(numerical), **{f"f{f}": _as_tensor(i) for f, i in enumerate(ids)}}


def build_tf_dlrm(rows: int, batches, learning_rate: float, validate_ids: bool = True, use_kernel: bool = True,
                  embedding_optimizer: str = "sgd", ragged: bool = False):
    import tensorflow as tf

    from tf_dlrm.embedding import DistributedEmbedding
    from tf_dlrm.parallel.env import DistributedEnv
    from tf_dlrm.models.dlrm import DLRM
    from tf_dlrm.optimizers.settings import LearningRateSchedule
    from tf_dlrm.optimizers.settings import OptimizerConfig
    from tf_dlrm.train.step import Trainer

    embedding = DistributedEmbedding(feature_configs(rows, ragged), validate_ids=validate_ids, use_kernel=use_kernel,
                                     name="embedding")
    model = DLRM(embedding, NUM_NUMERICAL, bottom_mlp_dims=BOTTOM, top_mlp_dims=TOP, interaction="cat")
    env = DistributedEnv()
    model(_features(*batches[0][:2]))
    trainer = Trainer(model, env, OptimizerConfig(LearningRateSchedule(learning_rate), embedding_optimizer=embedding_optimizer))
    tensors = [(_features(n, ids), tf.constant(l)) for n, ids, l in batches]
    return trainer.train_step, tensors


def build_naive(rows: int, batches, learning_rate: float, sparse: bool):
    import keras
    import numpy as np
    import tensorflow as tf

    class NaiveMultiHot(keras.Model):
        def __init__(self):
            super().__init__()
            self.tables = [keras.layers.Embedding(rows, width(f), name=f"embedding_{f}") for f in range(NUM_FEATURES)]
            for table in self.tables:
                table.build((None,))
            self.bottom = [keras.layers.Dense(w, activation="relu") for w in BOTTOM]
            self.top = [keras.layers.Dense(w, activation="relu") for w in TOP[:-1]] + [keras.layers.Dense(TOP[-1])]

        def call(self, inputs):
            numerical, categorical = inputs
            bottom = numerical
            for layer in self.bottom:
                bottom = layer(bottom)
            pooled = []
            for f, (table, ids) in enumerate(zip(self.tables, categorical)):
                if sparse:
                    pooled.append(tf.nn.safe_embedding_lookup_sparse(table.embeddings.value, ids, combiner=combiner(f)))
                else:
                    vectors = tf.gather(table.embeddings.value, ids)  # ragged [b, None, w]
                    pool = tf.reduce_sum if combiner(f) == "sum" else tf.reduce_mean
                    pooled.append(pool(vectors, axis=1))
            top = tf.concat([bottom] + pooled, axis=1)
            for layer in self.top:
                top = layer(top)
            return top

    def convert(ids):
        if not sparse:
            return tf.RaggedTensor.from_tensor(tf.constant(ids))
        samples, columns = np.meshgrid(np.arange(ids.shape[0]), np.arange(ids.shape[1]), indexing="ij")
        indices = np.stack([samples.reshape(-1), columns.reshape(-1)], axis=1).astype(np.int64)
        return tf.SparseTensor(indices, tf.constant(ids.reshape(-1).astype(np.int64)), ids.shape)

    model = NaiveMultiHot()
    optimizer = keras.optimizers.SGD(learning_rate=learning_rate)
    tensors = [(tf.constant(n), tuple(convert(i) for i in ids), tf.constant(l)) for n, ids, l in batches]
    model(tensors[0][:2])
    optimizer.build(model.trainable_variables)

    @tf.function
    def step(numerical, categorical, label):
        with tf.GradientTape() as tape:
            logits = model((numerical, categorical))
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits))
        variables = model.trainable_variables
        optimizer.apply(tape.gradient(loss, variables), variables)
        return loss

    return step, tensors


def alltoall_bytes(rows: int, batch_size: int) -> dict:
    """Embedding alltoall bytes per step (forward) of the busiest rank, from the widths the layer
    itself sends (``send_widths``), for this multi-hot config and the same tables one-hot."""
    from tf_dlrm.embedding import DistributedEmbedding
    from tf_dlrm.parallel.env import DistributedEnv

    multi_hot = feature_configs(rows)
    one_hot = [dataclasses.replace(f, hotness=1, combiner="sum") for f in multi_hot]
    result = {}
    for world_size in (2, 8):
        local_batch = batch_size // world_size
        sent = {}
        for name, features in (("multi_hot", multi_hot), ("one_hot", one_hot)):
            layer = DistributedEmbedding(features, env=DistributedEnv(rank=0, world_size=world_size),
                                         data_parallel_threshold=0, data_parallel_input=False)
            sent[name] = (world_size - 1) * local_batch * max(layer.send_widths) * 4
        sent["ids_per_step"] = sum(hotness(f) for f in range(NUM_FEATURES)) * batch_size
        result[str(world_size)] = sent
    return result


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--batch_size", type=int, default=2048)
    parser.add_argument("--num_batches", type=int, default=4)
    parser.add_argument("--warmup_steps", type=int, default=3)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--window_steps", type=int, default=5)
    parser.add_argument("--cases", default="naive_sparse,naive_ragged,tf_dlrm")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    batches = make_batches(args.num_batches, args.batch_size, args.rows, args.seed)
    builders = {
        "naive_sparse": lambda: build_naive(args.rows, batches, 0.05, sparse=True),
        "naive_ragged": lambda: build_naive(args.rows, batches, 0.05, sparse=False),
        "tf_dlrm": lambda: build_tf_dlrm(args.rows, batches, 0.05),
        # Variable-length rows at the same mean ids per row (tf.RaggedTensor inputs, ragged features).
        "tf_dlrm_ragged": lambda: build_tf_dlrm(args.rows, ragged_batches(batches, args.seed), 0.05, ragged=True),
        # The same without the id range and hotness checks (what they cost).
        "tf_dlrm_unchecked": lambda: build_tf_dlrm(args.rows, batches, 0.05, validate_ids=False),
        # Plain TensorFlow pooling (unique, gather, segment sum per feature) instead of the kernel.
        "tf_dlrm_without_kernel": lambda: build_tf_dlrm(args.rows, batches, 0.05, use_kernel=False),
        # The trainer's default embedding optimizer (lazy Adam; the naive cases keep SGD, so only the
        # ratio between these two cases compares like with like).
        "tf_dlrm_lazy_adam": lambda: build_tf_dlrm(args.rows, batches, 0.05, embedding_optimizer="lazy_adam"),
        "tf_dlrm_lazy_adam_without_kernel": lambda: build_tf_dlrm(args.rows, batches, 0.05, use_kernel=False,
                                                                  embedding_optimizer="lazy_adam"),
    }
    names = args.cases.split(",")
    cases = {name: builders[name]() for name in names}
    windows = {name: [] for name in names}

    def run(name, steps):
        step, tensors = cases[name]
        started = time.perf_counter()
        for index in range(steps):
            loss = step(*tensors[index % len(tensors)])
        loss.numpy()
        return steps * args.batch_size / (time.perf_counter() - started)

    for name in names:
        run(name, args.warmup_steps)
    for _ in range(args.windows):
        for name in names:
            windows[name].append(run(name, args.window_steps))
    medians = {name: statistics.median(values) for name, values in windows.items()}
    out = []
    for name in names:
        values = windows[name]
        record = {
            "benchmark": "multi_hot_throughput", "config": f"26_features_hotness_1_to_20_rows_{args.rows}",
            "impl": "tf_dlrm" if name.startswith("tf_dlrm") else "naive_keras", "case": name, "precision": "fp32",
            "xla": False, "world_size": 1, "batch_size": args.batch_size,
            "samples_per_s": {"median": round(medians[name], 1), "min": round(min(values), 1), "max": round(max(values), 1)},
        }
        if name != "tf_dlrm" and name.startswith("tf_dlrm") and "tf_dlrm" in medians:
            record["vs_tf_dlrm"] = round(medians[name] / medians["tf_dlrm"], 3)
        for naive in ("naive_sparse", "naive_ragged"):
            if naive in medians:
                record[f"vs_{naive}"] = round(medians[name] / medians[naive], 3)
        out.append(record)
    out.append({"benchmark": "multi_hot_alltoall_bytes", "batch_size": args.batch_size, "per_world_size": alltoall_bytes(args.rows, args.batch_size)})
    for record in out:
        print(json.dumps(record), flush=True)
    return out


if __name__ == "__main__":
    main()
