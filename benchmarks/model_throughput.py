r"""Training throughput of DCNv2, DeepFM and Wide & Deep: tf_dlrm vs the same model in plain Keras.

    python benchmarks/model_throughput.py --config=criteo_capped [--models=dcnv2,deepfm,wide_deep] \
        [--windows=5] [--window_steps=5]

For each model, two cases on the same in-memory batches of a synthetic dataset of the config's
shape (as ``train_throughput.py``): ``tf_dlrm`` (``tf_dlrm.models`` built by the trainer's builder,
one process, :class:`tf_dlrm.train.step.Trainer` with sparse SGD on the tables and SGD on the dense
weights) and ``naive_keras`` (:mod:`naive_family`: per-feature ``keras.layers.Embedding``, Keras
SGD on everything). Both fp32. After warm-up the cases take turns, one window each per round.
The hyper-parameters are :data:`MODEL_SETTINGS` (DCNv2's cross matrices low rank, as the paper
recommends for wide inputs); Wide & Deep crosses categorical features 0x1 and 2x3 (100k buckets each).

Prints one JSON line per case: ``{"benchmark": "model_throughput", "config": ..., "model": ...,
"impl": "tf_dlrm"|"naive_keras", "precision": "fp32", "xla": false, "world_size": 1,
"samples_per_s": {"median", "min", "max"}, "vs_naive_fp32": ..., "cpu_ms_per_step": ...,
"vs_naive_fp32_cpu": ...}`` (ratio of medians to the naive case of the same model; ``_cpu``: of the
naive case's median CPU time per step to this case's, the process's CPU time over a window, steadier
than wall time when other jobs share the cores).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from emit import emit  # noqa: E402
from train_throughput import (CONFIGS, configure_threads, feature_tensors, load_average, make_dataset,  # noqa: E402
                              read_batches, summarize)

MODEL_SETTINGS = {
    "dcnv2": {"num_cross_layers": 3, "cross_low_rank": 64, "deep_mlp_dims": (512, 256)},
    "deepfm": {"deep_mlp_dims": (512, 256)},
    "wide_deep": {"deep_mlp_dims": (512, 256)},
}
CROSSED_BUCKETS = 100_000


def crossed_pairs(spec) -> list[tuple[int, int, int]]:
    return [(0, 1, CROSSED_BUCKETS), (2, 3, CROSSED_BUCKETS)]


class ModelCase:
    """One measured implementation of one model: a step function and its batches as tensors."""

    def __init__(self, model: str, impl: str, config, spec, batches, learning_rate: float, seed: int):
        import keras
        import tensorflow as tf

        keras.utils.set_random_seed(seed)
        self.model, self.impl, self.batch_size = model, impl, config.batch_size
        settings = MODEL_SETTINGS[model]
        if impl == "naive_keras":
            from naive_family import build_naive_family

            trainer = build_naive_family(model, spec.cardinalities(), config.embedding_dim, len(spec.numerical_features),
                                         learning_rate, crossed=crossed_pairs(spec), **settings)
            self.step = trainer.train_step
            self.batches = [(tf.constant(n), tuple(tf.constant(i) for i in ids), tf.constant(l)) for n, ids, l in batches]
        else:
            from tf_dlrm.parallel.env import DistributedEnv
            from tf_dlrm.cli import builder
            from tf_dlrm.cli.model_config import ModelConfig, ShardingConfig
            from tf_dlrm.models import registry
            from tf_dlrm.optimizers.settings import LearningRateSchedule
            from tf_dlrm.optimizers.settings import OptimizerConfig
            from tf_dlrm.train.step import Trainer

            if model == "wide_deep":
                names = spec.categorical_features
                spec.crossed_features_entries = [{"features": [names[a], names[b]], "buckets": buckets}
                                                 for a, b, buckets in crossed_pairs(spec)]
            model_config = ModelConfig(config.embedding_dim, name=model, params=registry.lookup(model).Config(**settings))
            env = DistributedEnv()
            plan = builder.make_sharding_plan(spec, model_config, ShardingConfig(), 1)
            network = builder.build_model(spec, plan, model_config, env, seed)
            spec.crossed_features_entries = []
            trainer = Trainer(network, env, OptimizerConfig(LearningRateSchedule(learning_rate)))
            self.step = trainer.train_step
            self.batches = [(feature_tensors(spec, network.input_modes, n, ids), tf.constant(l)) for n, ids, l in batches]
        self.position, self.windows, self.cpu_ms = 0, [], []

    def run(self, steps: int) -> float:
        started, cpu_started = time.perf_counter(), time.process_time()
        for _ in range(steps):
            loss = self.step(*self.batches[self.position % len(self.batches)])
            self.position += 1
        loss.numpy()
        # The process's CPU time per step: steadier than wall time while other jobs share the cores.
        self.cpu_ms.append((time.process_time() - cpu_started) / steps * 1000.0)
        return steps * self.batch_size / (time.perf_counter() - started)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="criteo_capped", choices=sorted(CONFIGS))
    parser.add_argument("--models", default="dcnv2,deepfm,wide_deep")
    parser.add_argument("--warmup_steps", type=int, default=3)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--window_steps", type=int, default=5)
    parser.add_argument("--num_batches", type=int, default=4)
    parser.add_argument("--learning_rate", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    config = CONFIGS[args.config]
    intra, inter = configure_threads(0, 0)
    with tempfile.TemporaryDirectory(prefix="tf_dlrm_models_") as directory:
        spec = make_dataset(config, os.path.join(directory, "train"), config.batch_size * args.num_batches, args.seed)
        batches = read_batches(spec, config.batch_size, args.num_batches)
    out = []
    for model in args.models.split(","):
        if model not in MODEL_SETTINGS:
            parser.error(f"unknown model {model!r}; expected some of {list(MODEL_SETTINGS)}")
        load_before = load_average()
        cases = [ModelCase(model, impl, config, spec, batches, args.learning_rate, args.seed) for impl in ("naive_keras", "tf_dlrm")]
        for case in cases:
            case.run(args.warmup_steps)
        for _ in range(args.windows):
            for case in cases:
                case.windows.append(case.run(args.window_steps))
        naive = statistics.median(cases[0].windows)
        naive_cpu = statistics.median(cases[0].cpu_ms[-args.windows:])
        for case in cases:
            cpu_ms = statistics.median(case.cpu_ms[-args.windows:])
            record = {"benchmark": "model_throughput", "config": args.config, "model": model, "impl": case.impl,
                      "precision": "fp32", "xla": False, "world_size": 1, "samples_per_s": summarize(case.windows),
                      "vs_naive_fp32": round(statistics.median(case.windows) / naive, 3),
                      "cpu_ms_per_step": round(cpu_ms, 1), "vs_naive_fp32_cpu": round(naive_cpu / cpu_ms, 3), "batch_size": config.batch_size,
                      "windows": args.windows, "window_steps": args.window_steps, "intra_op_threads": intra,
                      "inter_op_threads": inter, "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in MODEL_SETTINGS[model].items()},
                      "load_average_1m": [load_before, load_average()]}
            emit(record)
            out.append(record)
    return out


if __name__ == "__main__":
    main()
