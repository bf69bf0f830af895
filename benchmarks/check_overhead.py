r"""What the data and non-finite checks of issue #15 cost: checked vs unchecked, in one process run.

    python benchmarks/check_overhead.py --config=criteo_capped [--windows=7] [--window_steps=10]

Two pairs of cases, each pair taking turns window by window (a change of machine load hits both):

- ``train_checked`` / ``train_unchecked``: the training loop's hot path on files from disk, the
  split_binary reader's ``tf.data`` pipeline feeding ``Trainer.train_step``. Checked: the reader
  refuses out-of-range ids and non-finite numericals (``validate=True``, the default) and every
  step's loss goes to a :class:`tf_dlrm.train.guards.LossWatch` read at the end of the window, as
  ``main.py`` reads it every ``--print_freq`` steps. Unchecked: ``validate=False`` and only the last
  loss is read (the loop before issue #15). The checked record also carries ``check_ms_per_batch``
  (the reader's checks timed alone on the same batches) and ``check_fraction_of_step`` (that over
  the unchecked step time): a floor of the cost that machine load does not blur.
- ``loader_checked`` / ``loader_unchecked``: the reader alone (the checks without a step to hide behind).

Prints one JSON object per case and line: ``{"benchmark": "check_overhead", "config": ..., "impl":
"tf_dlrm", "case": ..., "samples_per_s": {"median", "min", "max"}, "vs_unchecked": ...}``; the
unchecked case of each pair is its baseline (``vs_unchecked`` = ratio of medians).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from emit import emit  # noqa: E402
from train_throughput import CONFIGS, configure_threads, make_dataset, summarize  # noqa: E402


class Pipeline:
    """One case: a reader's batches (of the features ``input_modes`` names), optionally trained on;
    ``run(n)`` returns samples/s."""

    def __init__(self, name, spec, batch_size, input_modes, trainer, validate):
        from tf_dlrm.data.reader import SplitBinaryReader
        from tf_dlrm.train.guards import LossWatch

        self.name, self.trainer, self.validate = name, trainer, validate
        self.reader = SplitBinaryReader(
            spec, "train", batch_size, input_modes=input_modes, shuffle=True, seed=1, validate=validate,
        )
        self.batches = iter(self.reader.dataset(epoch=0).repeat())
        self.batch_size = batch_size
        self.watch = LossWatch()
        self.windows: list[float] = []

    def run(self, steps: int) -> float:
        started = time.perf_counter()
        loss = None
        for _ in range(steps):
            features, label = next(self.batches)
            if self.trainer is None:
                continue
            loss = self.trainer.train_step(features, label)
            if self.validate:
                self.watch.add(loss)
        if loss is not None:
            self.watch.read("learning rate") if self.validate else loss.numpy()
        return steps * self.batch_size / (time.perf_counter() - started)


def check_milliseconds(pair, batches: int, repeats: int = 5) -> float:
    """Per-batch cost of the checks alone: ``read_batch`` checked minus unchecked (median of medians).

    Timed on the same batches in turn, without tf.data threads or a training step, so machine load
    shifts both alike; the training pair's ratio is the end-to-end figure, this one its floor.
    """
    unchecked, checked = pair[0].reader, pair[1].reader
    differences = []
    for _ in range(repeats):
        times = {True: [], False: []}
        for batch in range(batches):
            for reader in (unchecked, checked):
                started = time.perf_counter()
                reader.read_batch(batch)
                times[reader.validate].append(time.perf_counter() - started)
        differences.append(statistics.median(times[True]) - statistics.median(times[False]))
    return max(0.0, statistics.median(differences)) * 1e3


def build_trainer(config, spec, seed):
    from tf_dlrm.parallel.env import DistributedEnv
    from tf_dlrm.cli import builder
    from tf_dlrm.cli.model_config import ModelConfig, ShardingConfig
    from tf_dlrm.models.dlrm import DLRMConfig
    from tf_dlrm.optimizers.settings import LearningRateSchedule
    from tf_dlrm.optimizers.settings import OptimizerConfig
    from tf_dlrm.train.step import Trainer

    env = DistributedEnv()
    model_config = ModelConfig(config.embedding_dim, params=DLRMConfig(config.bottom_mlp_dims, config.top_mlp_dims))
    plan = builder.make_sharding_plan(spec, model_config, ShardingConfig(), 1)
    model = builder.build_model(spec, plan, model_config, env, seed)
    return model.input_modes, Trainer(model, env, OptimizerConfig(LearningRateSchedule(0.05)))


def measure(pair, warmup_steps, windows, window_steps):
    for case in pair:
        case.run(warmup_steps)
    for _ in range(windows):
        for case in pair:
            case.windows.append(case.run(window_steps))


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="criteo_capped", choices=sorted(CONFIGS))
    parser.add_argument("--warmup_steps", type=int, default=5)
    parser.add_argument("--windows", type=int, default=7)
    parser.add_argument("--window_steps", type=int, default=10)
    parser.add_argument("--loader_window_steps", type=int, default=50)
    parser.add_argument("--num_batches", type=int, default=16, help="global batches in the dataset on disk")
    parser.add_argument("--work_dir", default=None)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    config = CONFIGS[args.config]
    intra, inter = configure_threads(0, 0)
    out = []
    with tempfile.TemporaryDirectory(prefix="tf_dlrm_check_bench_") as temporary:
        directory = os.path.join(args.work_dir or temporary, f"{args.config}_check")
        spec = make_dataset(config, directory, config.batch_size * args.num_batches, args.seed)
        input_modes, trainer = build_trainer(config, spec, args.seed)
        pairs = [
            ("train", [Pipeline(f"train_{kind}", spec, config.batch_size, input_modes, trainer, kind == "checked")
                       for kind in ("unchecked", "checked")], args.window_steps),
            ("loader", [Pipeline(f"loader_{kind}", spec, config.batch_size, input_modes, None, kind == "checked")
                        for kind in ("unchecked", "checked")], args.loader_window_steps),
        ]
        for kind, pair, steps in pairs:
            measure(pair, args.warmup_steps, args.windows, steps)
            baseline = statistics.median(pair[0].windows)
            extra = {}
            if kind == "train":
                check_ms = check_milliseconds(pair, args.num_batches)
                step_ms = config.batch_size / baseline * 1e3
                extra = {"check_ms_per_batch": round(check_ms, 4), "unchecked_ms_per_step": round(step_ms, 2),
                         "check_fraction_of_step": round(check_ms / step_ms, 5)}
            for case in pair:
                out.append({
                    "benchmark": "check_overhead", "config": args.config, "impl": "tf_dlrm", "precision": "fp32",
                    "xla": False, "world_size": 1, "case": case.name, "samples_per_s": summarize(case.windows),
                    "vs_unchecked": round(statistics.median(case.windows) / baseline, 4),
                    "batch_size": config.batch_size, "windows": args.windows, "window_steps": steps,
                    "intra_op_threads": intra, "inter_op_threads": inter, **(extra if case is pair[1] else {}),
                })
            for case in pair:
                case.reader.close()
    for record in out:
        emit(record)
    return out


if __name__ == "__main__":
    main()
