r"""Training throughput of tf_dlrm and of a naive Keras DLRM, measured in one process.

    python benchmarks/train_throughput.py --config=criteo_capped \
        [--cases=naive_fp32,naive_bf16,tf_dlrm_fp32,tf_dlrm_amp,tf_dlrm_xla] [--windows=7] [--window_steps=10]

Both implementations train on the same batches: ``--num_batches`` global batches of a synthetic
dataset of the config's shape (written with :mod:`tf_dlrm.data.synthetic`, read back with the
split_binary reader) held in memory, so the figures measure the training step, not the disk
(``loader_throughput.py`` measures the loader alone). After ``--warmup_steps`` steps per case
(tracing included), the cases take turns: one window of ``--window_steps`` steps each, ``--windows``
rounds, so a change of machine load hits every case alike. Precision ``bf16`` is Keras'
``mixed_bfloat16`` policy (``--amp`` on CPU; ``fp16`` would be ``mixed_float16`` on GPU).

Prints one JSON object per case and line:
``{"benchmark": "train_throughput", "config": ..., "impl": "tf_dlrm"|"naive_keras", "precision": "fp32"|"bf16",
"xla": false, "world_size": 1, "samples_per_s": {"median": ..., "min": ..., "max": ...},
"vs_naive_fp32": ..., ...}`` where ``vs_naive_fp32`` is the ratio of medians to the naive fp32 case.
The diagnostic case ``mlp_only_fp32`` (``"impl": "mlp_only"``, only when asked for) trains the two
MLPs alone: no DLRM of the config can train faster. The cases ``tf_dlrm_adagrad``,
``tf_dlrm_rowwise_adagrad``, ``tf_dlrm_lazy_adam`` and ``tf_dlrm_catch_up_adam`` change only the embedding optimizer; their
``vs_tf_dlrm_sgd`` is the ratio to ``tf_dlrm_fp32`` (sparse SGD) in the same run. The cases
``tf_dlrm_amp_split`` (SGD) and ``tf_dlrm_amp_split_lazy_adam`` train under ``--amp`` with split bf16
tables (``--split_embedding_tables``; ``"split_embedding_tables": true`` in their line): compare them
with ``tf_dlrm_amp`` and ``tf_dlrm_amp_lazy_adam`` of the same run.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPOSITORY)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from emit import emit  # noqa: E402


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    feature_spec: str  # relative to the repository
    embedding_dim: int
    bottom_mlp_dims: tuple[int, ...]
    top_mlp_dims: tuple[int, ...]
    batch_size: int
    model: str = "dlrm"  # tf_dlrm's --model; the naive and mlp_only cases are DLRMs and take only "dlrm"
    # The model's hyper-parameters as (name, value) pairs of its Config; empty: a DLRM of the two MLPs.
    # Plain pairs, so that reading CONFIGS imports no TensorFlow.
    params: tuple[tuple[str, object], ...] = ()

    def model_config(self):
        """The :class:`tf_dlrm.cli.model_config.ModelConfig` that ``main.py`` would build for this shape."""
        from tf_dlrm.cli.model_config import ModelConfig
        from tf_dlrm.models.registry import lookup

        params = dict(self.params) or {"bottom_mlp_dims": self.bottom_mlp_dims, "top_mlp_dims": self.top_mlp_dims}
        return ModelConfig(self.embedding_dim, name=self.model, params=lookup(self.model).Config(**params))


CONFIGS = {
    # Criteo 1TB's shape, every table capped at 100k rows; NVIDIA's DLRM MLPs.
    "criteo_capped": BenchConfig("feature_specs/criteo_capped.yaml", 128, (512, 256, 128), (1024, 1024, 512, 256, 1), 2048),
    # The same tables with dim 16 and small MLPs: the embedding path weighs more.
    # MLPerf Training's DLRM-DCNv2 (multi-hot, sum pooling) on the same capped tables, as NVIDIA's dcnv2.py builds
    # it (main.py --interaction=cross): the 512-256-128 bottom MLP on the numerical features, three cross layers of
    # rank 512 over its output and the 26 embeddings (27 x 128 = 3,456 wide), then 1024-1024-512-256 and the logit.
    "dlrm_dcnv2_capped": BenchConfig("feature_specs/dlrm_dcnv2_capped.yaml", 128, (512, 256, 128), (1024, 1024, 512, 256, 1), 2048,
                                     params=(("bottom_mlp_dims", (512, 256, 128)), ("top_mlp_dims", (1024, 1024, 512, 256, 1)),
                                             ("interaction", "cross"), ("num_cross_layers", 3), ("cross_low_rank", 512))),
    "small": BenchConfig("feature_specs/criteo_capped.yaml", 16, (512, 256, 64, 16), (512, 256, 1), 2048),
    # For smoke tests only.
    "tiny": BenchConfig("feature_specs/synthetic_small.yaml", 8, (16, 8), (16, 1), 256),
}

# case name -> (impl, amp, xla)
CASES = {
    "naive_fp32": ("naive_keras", False, False),
    "naive_bf16": ("naive_keras", True, False),
    "tf_dlrm_fp32": ("tf_dlrm", False, False),
    "tf_dlrm_amp": ("tf_dlrm", True, False),
    "tf_dlrm_xla": ("tf_dlrm", False, True),
}
# Diagnostic, not run by default: the bottom and top MLPs alone (inputs of the right shapes, no
# embeddings, no interaction), trained like tf_dlrm's MLPs: the ceiling of any DLRM of the config.
EXTRA_CASES = {"mlp_only_fp32": ("mlp_only", False, False)}
# The sparse embedding optimizers (issue 11): tf_dlrm fp32 with only the embedding optimizer changed
# (MLPs still SGD), compared with ``tf_dlrm_fp32`` (sparse SGD) in the same run: ``vs_tf_dlrm_sgd``.
EMBEDDING_OPTIMIZER_CASES = {"tf_dlrm_adagrad": "adagrad", "tf_dlrm_rowwise_adagrad": "rowwise_adagrad", "tf_dlrm_lazy_adam": "lazy_adam",
                             "tf_dlrm_catch_up_adam": "catch_up_adam"}
EXTRA_CASES.update({name: ("tf_dlrm", False, False) for name in EMBEDDING_OPTIMIZER_CASES})
# Split bf16 tables (--split_embedding_tables, issue 14): --amp with the model-parallel tables stored as
# bf16 upper + uint16 lower halves; compare with tf_dlrm_amp (and tf_dlrm_amp_lazy_adam) in the same run.
SPLIT_CASES = {"tf_dlrm_amp_split", "tf_dlrm_amp_split_lazy_adam"}
EMBEDDING_OPTIMIZER_CASES.update({"tf_dlrm_amp_lazy_adam": "lazy_adam", "tf_dlrm_amp_split_lazy_adam": "lazy_adam"})
EXTRA_CASES.update({name: ("tf_dlrm", True, False) for name in ("tf_dlrm_amp_split", "tf_dlrm_amp_lazy_adam", "tf_dlrm_amp_split_lazy_adam")})
ALL_CASES = {**CASES, **EXTRA_CASES}


def summarize(values) -> dict:
    return {"median": round(statistics.median(values), 1), "min": round(min(values), 1), "max": round(max(values), 1)}


def load_average() -> float | None:
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def configure_threads(intra: int, inter: int, local_size: int = 1) -> tuple[int, int]:
    """The trainer's own rule (``tf_dlrm.cli.main.configure_threads``); 0 picks its default."""
    from tf_dlrm.cli.session import configure_threads as configure

    return configure(types.SimpleNamespace(intra_op_parallelism=intra, inter_op_parallelism=inter), local_size)


def make_dataset(config: BenchConfig, directory: str, num_samples: int, seed: int = 1):
    """A synthetic split_binary dataset of the config's shape (reused when already there)."""
    from tf_dlrm.data.synthetic import generate
    from tf_dlrm.spec.feature_spec import FeatureSpec

    path = os.path.join(directory, "feature_spec.yaml")
    if os.path.exists(path):
        spec = FeatureSpec.load(path)
        if spec.metadata.get("num_train_samples") == num_samples:
            return spec
    spec = FeatureSpec.load(os.path.join(REPOSITORY, config.feature_spec), check_files=False)
    return generate(spec, directory, num_samples, 0, seed)


def read_batches(spec, batch_size: int, count: int):
    """``count`` global batches as numpy ``(numerical, [ids of every table], label)``."""
    from tf_dlrm.data.reader import SplitBinaryReader

    # No input modes: every categorical feature, local (one process: the whole batch), in spec order.
    reader = SplitBinaryReader(spec, "train", batch_size)
    if reader.num_batches < count:
        raise ValueError(f"The dataset holds {reader.num_batches} batches of {batch_size}; {count} are needed")
    batches = [reader.read_batch(b) for b in range(count)]
    reader.close()
    return batches


def feature_tensors(spec, input_modes, numerical, ids) -> dict:
    """One batch of :func:`read_batches` (every table's ids, in spec order) as the dict of named features a
    model takes: ``"numerical"`` and the ids of each feature ``input_modes`` names (one process: global and
    local batches are the same rows)."""
    import tensorflow as tf

    from tf_dlrm.spec.format import NUMERICAL_CHANNEL

    return {NUMERICAL_CHANNEL: tf.constant(numerical),
            **{name: tf.constant(column) for name, column in zip(spec.categorical_features, ids) if name in input_modes}}


def read_batch_features(reader, spec, batch: int) -> tuple:
    """Global batch ``batch`` of a split_binary ``reader`` as tensors in the layout its dataset yields,
    ``(features by name, label)``: ``read_batch`` gives the ids of its global columns, then its local ones."""
    import tensorflow as tf

    from tf_dlrm.spec.format import NUMERICAL_CHANNEL

    numerical, categorical, label = reader.read_batch(batch)
    names = [spec.categorical_features[index] for index in reader.global_categorical + reader.local_categorical]
    return ({NUMERICAL_CHANNEL: tf.constant(numerical), **{name: tf.constant(ids) for name, ids in zip(names, categorical)}},
            tf.constant(label))


def build_tf_dlrm(config: BenchConfig, spec, env, seed: int, split_tables: bool = False):
    """The built tf_dlrm model of the config, sharded as ``main.py`` shards it by default."""
    from tf_dlrm.cli import builder
    from tf_dlrm.cli.model_config import ShardingConfig

    model_config = config.model_config()
    plan = builder.make_sharding_plan(spec, model_config, ShardingConfig(), env.world_size)
    return builder.build_model(spec, plan, model_config, env, seed, split_embedding_tables=split_tables)


class Case:
    """One measured implementation: its step function and its batches, as tensors."""

    def __init__(self, name: str, config: BenchConfig, spec, batches, learning_rate: float, seed: int):
        import keras
        import tensorflow as tf

        from tf_dlrm.cli import builder

        self.name = name
        self.impl, self.amp, self.xla = ALL_CASES[name]
        self.embedding_optimizer = EMBEDDING_OPTIMIZER_CASES.get(name, "sgd")
        on_gpu = bool(tf.config.list_physical_devices("GPU"))
        policy = builder.set_precision(self.amp, on_gpu)
        self.precision = {"float32": "fp32", "mixed_bfloat16": "bf16", "mixed_float16": "fp16"}[policy]
        self.model = None  # tf_dlrm's model, once built
        if self.impl != "tf_dlrm" and config.model != "dlrm":
            raise ValueError(f"Expected a DLRM config for case {name} (it builds a DLRM of the two MLPs). "
                             f"Received: a config of --model={config.model}")
        try:
            if self.impl == "naive_keras":
                self.step, self.batches = self._naive(config, spec, batches, learning_rate)
            elif self.impl == "mlp_only":
                self.step, self.batches = self._mlp_only(config, spec, batches, learning_rate)
            else:
                self.step, self.batches = self._tf_dlrm(config, spec, batches, learning_rate, seed, self.xla, self.embedding_optimizer,
                                                        split_tables=name in SPLIT_CASES)
        finally:
            keras.mixed_precision.set_global_policy("float32")
        self.batch_size = config.batch_size
        self.position = 0
        self.windows: list[float] = []

    @staticmethod
    def _naive(config, spec, batches, learning_rate):
        import tensorflow as tf

        from naive_dlrm import build_naive

        trainer = build_naive(
            spec.cardinalities(), config.embedding_dim, config.bottom_mlp_dims, config.top_mlp_dims,
            len(spec.numerical_features), learning_rate,
        )
        tensors = [(tf.constant(n), tuple(tf.constant(i) for i in ids), tf.constant(l)) for n, ids, l in batches]
        return trainer.train_step, tensors

    @staticmethod
    def _mlp_only(config, spec, batches, learning_rate):
        import keras
        import numpy as np
        import tensorflow as tf

        from tf_dlrm.models.layers.mlp import MLP

        vectors = len(spec.categorical_features) + 1
        width = config.bottom_mlp_dims[-1] + vectors * (vectors - 1) // 2  # the top MLP's input
        bottom = MLP(config.bottom_mlp_dims, final_activation="relu", name="bottom_mlp")
        top = MLP(config.top_mlp_dims, final_activation=None, name="top_mlp")
        bottom.build((None, len(spec.numerical_features)))
        top.build((None, width))
        variables = bottom.trainable_variables + top.trainable_variables
        optimizer = keras.optimizers.SGD(learning_rate=learning_rate)
        optimizer.build(variables)
        pairs = tf.constant(np.random.default_rng(0).random((config.batch_size, width - config.bottom_mlp_dims[-1]), np.float32))

        @tf.function
        def step(numerical, label):
            with tf.GradientTape() as tape:
                logits = top(tf.concat([bottom(numerical), pairs], axis=1))
                loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits))
            optimizer.apply(tape.gradient(loss, variables), variables)
            return loss

        return step, [(tf.constant(n), tf.constant(l)) for n, _, l in batches]

    def _tf_dlrm(self, config, spec, batches, learning_rate, seed, xla, embedding_optimizer="sgd", split_tables=False):
        import tensorflow as tf

        from tf_dlrm.optimizers.settings import LearningRateSchedule, OptimizerConfig
        from tf_dlrm.parallel.env import DistributedEnv
        from tf_dlrm.train.step import Trainer

        env = DistributedEnv()
        model = self.model = build_tf_dlrm(config, spec, env, seed, split_tables)
        optimizer = OptimizerConfig(LearningRateSchedule(learning_rate), embedding_optimizer=embedding_optimizer)
        trainer = Trainer(model, env, optimizer, jit_compile=xla)
        return trainer.train_step, [(feature_tensors(spec, model.input_modes, n, ids), tf.constant(l))
                                    for n, ids, l in batches]

    def run(self, steps: int) -> float:
        """Runs ``steps`` steps; returns samples/s (the last loss is read back: the step is done)."""
        started = time.perf_counter()
        for _ in range(steps):
            loss = self.step(*self.batches[self.position % len(self.batches)])
            self.position += 1
        loss.numpy()
        return steps * self.batch_size / (time.perf_counter() - started)


def measure(cases: list[Case], warmup_steps: int, windows: int, window_steps: int) -> None:
    for case in cases:
        case.run(warmup_steps)
    for _ in range(windows):
        for case in cases:
            case.windows.append(case.run(window_steps))


def records(cases: list[Case], config_name: str, extra: dict) -> list[dict]:
    naive = [c for c in cases if c.impl == "naive_keras" and c.precision == "fp32"]
    reference = statistics.median(naive[0].windows) if naive else None
    sgd = [c for c in cases if c.name == "tf_dlrm_fp32"]
    sgd_median = statistics.median(sgd[0].windows) if sgd else None
    out = []
    for case in cases:
        median = statistics.median(case.windows)
        out.append({
            "benchmark": "train_throughput",
            "config": config_name,
            "impl": case.impl,
            "precision": case.precision,
            "xla": case.xla,
            "world_size": 1,
            "samples_per_s": summarize(case.windows),
            "vs_naive_fp32": round(median / reference, 3) if reference else None,
            "case": case.name,
            "embedding_optimizer": getattr(case, "embedding_optimizer", "sgd") if case.impl == "tf_dlrm" else None,
            "split_embedding_tables": case.name in SPLIT_CASES,
            "vs_tf_dlrm_sgd": round(median / sgd_median, 3) if sgd_median and case.impl == "tf_dlrm" else None,
            **extra,
        })
    return out


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="criteo_capped", choices=sorted(CONFIGS))
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, from {list(ALL_CASES)}")
    parser.add_argument("--batch_size", type=int, default=0, help="global batch (0: the config's)")
    parser.add_argument("--warmup_steps", type=int, default=5)
    parser.add_argument("--windows", type=int, default=7)
    parser.add_argument("--window_steps", type=int, default=10)
    parser.add_argument("--num_batches", type=int, default=8, help="distinct batches held in memory")
    parser.add_argument("--learning_rate", type=float, default=0.05)
    parser.add_argument("--intra_op_parallelism", type=int, default=0, help="0: the trainer's default")
    parser.add_argument("--inter_op_parallelism", type=int, default=0, help="0: the trainer's default")
    parser.add_argument("--work_dir", default=None, help="where the synthetic data goes (default: a temporary directory)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    unknown = [c for c in args.cases.split(",") if c not in ALL_CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; expected some of {list(ALL_CASES)}")
    return args


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    config = CONFIGS[args.config]
    if args.batch_size:
        config = dataclasses.replace(config, batch_size=args.batch_size)
    intra, inter = configure_threads(args.intra_op_parallelism, args.inter_op_parallelism)
    with tempfile.TemporaryDirectory(prefix="tf_dlrm_bench_") as temporary:
        directory = args.work_dir or temporary
        spec = make_dataset(config, os.path.join(directory, f"{args.config}_train"), config.batch_size * args.num_batches, args.seed)
        batches = read_batches(spec, config.batch_size, args.num_batches)
    load_before = load_average()
    cases = [Case(name, config, spec, batches, args.learning_rate, args.seed) for name in args.cases.split(",")]
    measure(cases, args.warmup_steps, args.windows, args.window_steps)
    extra = {
        "batch_size": config.batch_size,
        "windows": args.windows,
        "window_steps": args.window_steps,
        "intra_op_threads": intra,
        "inter_op_threads": inter,
        "load_average_1m": [load_before, load_average()],
    }
    out = records(cases, args.config, extra)
    for record in out:
        emit(record)
    return out


if __name__ == "__main__":
    main()
