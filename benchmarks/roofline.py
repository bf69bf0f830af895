r"""How far ``main.py``'s training step is from what this machine's matmuls and memory allow.

    python benchmarks/roofline.py [--configs=criteo_capped,dlrm_dcnv2_capped] [--batch_sizes=2048,16384] \
        [--precisions=fp32,bf16] [--windows=5] [--window_steps=5] [--markdown=benchmarks/results/roofline.md]

For each config and batch size it builds tf_dlrm's model as ``main.py`` does (``train_throughput.py``'s
cases ``tf_dlrm_fp32`` and ``tf_dlrm_amp``: batches held in memory, SGD on the tables) and counts, from the
built model:

- **FLOPs per sample**: every matrix weight of the dense part (MLP kernels, cross-layer matrices) is one
  ``[batch, in] x [in, out]`` matmul, ``2 in out`` FLOPs per sample forward; the dot interaction adds
  ``2 D`` per pair of vectors it keeps (the strict lower triangle: ``F (F - 1) / 2`` pairs, plus ``F`` with
  the diagonal). Training counts three times the forward: the forward, the input gradient and the weight
  gradient of each matmul. Element-wise work (bias, activation, loss) is not counted.
- **Embedding bytes per sample** (float32 tables, without deduplication): the gathers (each id's row read,
  each table's pooled vector written), the exchange (the pooled vectors and their gradients, in the compute
  dtype) and the update (each id's row and gradient read and the row written; SGD keeps no state).

and measures, interleaved with the training windows (so a change of load hits all alike), TensorFlow's own
matmul rate at exactly those shapes and precision (each matrix weight's three products: ``X W``,
``dY W^T``, ``X^T dY`` at the batch size) and a STREAM-like memory bandwidth through TensorFlow ops on
arrays far larger than the caches (copy: ``b = a * 1``; triad: ``a = b + s c``, fused by XLA into one pass).

The compute roofline is ``matmul FLOP/s / FLOPs per sample`` samples/s, the memory roofline
``copy bytes/s / embedding bytes per sample``; each configuration's fraction is its training rate over
each (``rate * flops_per_sample / matmul_flops_per_s``). Prints one JSON line per configuration
(``"benchmark": "roofline"``) and, with ``--markdown``, writes the table there.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from emit import emit, machine  # noqa: E402
from train_throughput import CONFIGS, REPOSITORY, Case, make_dataset, read_batches  # noqa: E402

PRECISION_CASES = {"fp32": "tf_dlrm_fp32", "bf16": "tf_dlrm_amp"}
FLOAT32_BYTES = 4
# Elements per array of the bandwidth measurement: 256 MiB of float32 each, far past any cache here.
STREAM_ELEMENTS = 1 << 26


@dataclasses.dataclass(frozen=True)
class ModelCost:
    """What one training sample of a model costs, counted from the built model."""

    matmul_shapes: tuple[tuple[int, int], ...]  # (in, out) of every matrix weight of the dense part
    interaction_macs: int  # multiply-adds of the dot interaction per sample, forward
    gather_bytes: int
    exchange_bytes: int
    update_bytes: int

    @property
    def dense_macs(self) -> int:
        return sum(i * o for i, o in self.matmul_shapes)

    @property
    def flops_per_sample(self) -> int:
        """Training FLOPs per sample: 2 per multiply-add, forward plus the two gradients' matmuls (3x)."""
        return 3 * 2 * (self.dense_macs + self.interaction_macs)

    @property
    def bytes_per_sample(self) -> int:
        return self.gather_bytes + self.exchange_bytes + self.update_bytes


def interaction_macs(model) -> int:
    """Multiply-adds of a DLRM's dot interaction per sample (0 for any other model or interaction)."""
    params = model.model_config
    if model.model_name != "dlrm" or params.interaction != "dot":
        return 0
    vectors = model.num_categorical + (1 if model.num_numerical else 0)
    pairs = vectors * (vectors - 1) // 2 + (vectors if params.include_diagonal else 0)
    width = params.bottom_mlp_dims[-1] if model.num_numerical else model.deep_width // model.num_categorical
    return pairs * width


def model_cost(model, spec, embedding_dim: int, compute_bytes: int) -> ModelCost:
    """The model's :class:`ModelCost`; ``compute_bytes`` is the size of one value of the compute dtype."""
    tables = {id(v) for v in model.embedding.variables}
    shapes = tuple((int(v.shape[0]), int(v.shape[1])) for v in model.trainable_variables
                   if id(v) not in tables and len(v.shape) == 2)
    features = spec.categorical_features
    widths = spec.embedding_dims(embedding_dim)
    ids_elements = sum(spec.hotness(f) * w for f, w in zip(features, widths))  # row elements the ids touch
    pooled = sum(widths)
    return ModelCost(
        matmul_shapes=shapes,
        interaction_macs=interaction_macs(model),
        gather_bytes=ids_elements * FLOAT32_BYTES + pooled * compute_bytes,
        exchange_bytes=2 * pooled * compute_bytes,
        update_bytes=3 * ids_elements * FLOAT32_BYTES,
    )


class MatmulRate:
    """TensorFlow's matmul rate at a model's shapes: each weight's forward, input-gradient and weight-gradient
    product at the batch size, in one graph, as FLOP/s."""

    def __init__(self, shapes, batch_size: int, precision: str, seed: int = 0):
        import tensorflow as tf

        dtype = tf.bfloat16 if precision == "bf16" else tf.float32
        generator = tf.random.Generator.from_seed(seed)
        self.operands = [tuple(tf.cast(generator.uniform(shape), dtype) for shape in ((batch_size, i), (i, o), (batch_size, o)))
                         for i, o in shapes]
        self.flops = 3 * 2 * batch_size * sum(i * o for i, o in shapes)

        @tf.function
        def products(operands):
            out = []
            for x, w, dy in operands:
                out += [tf.matmul(x, w), tf.matmul(dy, w, transpose_b=True), tf.matmul(x, dy, transpose_a=True)]
            return out  # returned, so that no product is pruned from the graph

        self.products = products
        self.measure(1)  # tracing

    def measure(self, repeats: int) -> float:
        started = time.perf_counter()
        for _ in range(repeats):
            out = self.products(self.operands)
        out[-1].numpy()
        return repeats * self.flops / (time.perf_counter() - started)


class Bandwidth:
    """STREAM-like memory bandwidth through TensorFlow: copy (``b = a * 1``, 2 arrays moved) and triad
    (``a = b + s c`` under XLA, one fused pass over 3 arrays), bytes/s."""

    def __init__(self, elements: int = STREAM_ELEMENTS):
        import tensorflow as tf

        self.elements = elements
        self.b = tf.fill([elements], 1.0)
        self.c = tf.fill([elements], 2.0)
        self.copy = tf.function(lambda a: a * 1.0)
        self.triad = tf.function(lambda b, c: b + 3.0 * c, jit_compile=True)
        self.measure()  # tracing and first touch of the outputs' pages

    def measure(self, repeats: int = 3) -> dict:
        rates = {}
        for name, call, arrays in (("copy", lambda: self.copy(self.b), 2), ("triad", lambda: self.triad(self.b, self.c), 3)):
            seconds = []
            for _ in range(repeats):
                started = time.perf_counter()
                call().numpy()  # numpy() of a CPU tensor shares its buffer: no extra pass
                seconds.append(time.perf_counter() - started)
            rates[name] = arrays * self.elements * FLOAT32_BYTES / min(seconds)
        return rates


def fractions(samples_per_s: float, cost: ModelCost, matmul_flops_per_s: float, bytes_per_s: float) -> dict:
    """The roofline figures of one configuration (rates in samples/s)."""
    compute_roofline = matmul_flops_per_s / cost.flops_per_sample
    memory_roofline = bytes_per_s / cost.bytes_per_sample
    return {
        "compute_roofline_samples_per_s": round(compute_roofline, 1),
        "compute_fraction": round(samples_per_s / compute_roofline, 3),
        "memory_roofline_samples_per_s": round(memory_roofline, 1),
        "memory_fraction": round(samples_per_s / memory_roofline, 3),
    }


def run_group(args, config_name: str, batch_size: int, work_dir: str, bandwidth: Bandwidth) -> list[dict]:
    """One config at one batch size: its precisions' training windows, matmul rates and bandwidth, interleaved."""
    config = dataclasses.replace(CONFIGS[config_name], batch_size=batch_size)
    spec = make_dataset(config, os.path.join(work_dir, f"{config_name}_{batch_size}"), batch_size * args.num_batches, args.seed)
    batches = read_batches(spec, batch_size, args.num_batches)
    cases = [Case(PRECISION_CASES[p], config, spec, batches, args.learning_rate, args.seed) for p in args.precisions]
    costs = [model_cost(c.model, spec, config.embedding_dim, 2 if c.precision == "bf16" else FLOAT32_BYTES) for c in cases]
    matmuls = [MatmulRate(cost.matmul_shapes, batch_size, case.precision) for case, cost in zip(cases, costs)]
    for case in cases:
        case.run(args.warmup_steps)
    rates = [[] for _ in cases]
    streams = []
    for _ in range(args.windows):
        for case, matmul, measured in zip(cases, matmuls, rates):
            case.windows.append(case.run(args.window_steps))
            measured.append(matmul.measure(args.matmul_repeats))
        streams.append(bandwidth.measure())
    copy = statistics.median(s["copy"] for s in streams)
    triad = statistics.median(s["triad"] for s in streams)
    out = []
    for case, cost, measured in zip(cases, costs, rates):
        samples_per_s = statistics.median(case.windows)
        matmul_rate = statistics.median(measured)
        out.append({
            "benchmark": "roofline", "config": config_name, "batch_size": batch_size, "precision": case.precision,
            "samples_per_s": round(samples_per_s, 1),
            "flops_per_sample": cost.flops_per_sample,
            "dense_macs_per_sample": cost.dense_macs, "interaction_macs_per_sample": cost.interaction_macs,
            "matmul_gflops_per_s": round(matmul_rate / 1e9, 3),
            "bytes_per_sample": {"gather": cost.gather_bytes, "exchange": cost.exchange_bytes, "update": cost.update_bytes,
                                 "total": cost.bytes_per_sample},
            "bandwidth_gb_per_s": {"copy": round(copy / 1e9, 2), "triad": round(triad / 1e9, 2)},
            **fractions(samples_per_s, cost, matmul_rate, copy),
            "windows": args.windows, "window_steps": args.window_steps,
        })
    return out


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPOSITORY, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def markdown(records: list[dict], command: str, measured_commit: str) -> str:
    cpu = machine()
    lines = [
        "# Roofline: training rate against this machine's matmul rate and memory bandwidth",
        "",
        f"CPU: {cpu.get('model', 'unknown')} ({os.cpu_count()} cores seen), bf16 native: {cpu['bf16_native']}; "
        f"commit {measured_commit}; {time.strftime('%Y-%m-%d', time.gmtime())}.",
        "",
        f"    {command}",
        "",
        "Compute fraction: the training rate over (TensorFlow's matmul FLOP/s at the model's own shapes and precision "
        "/ training FLOPs per sample). Memory fraction: the training rate over (the copy bandwidth / the embedding "
        "bytes per sample). Both measured in the same run, interleaved with the training windows; medians.",
        "",
        "| config | batch | precision | samples/s | MFLOP/sample | matmul GFLOP/s | compute fraction "
        "| embedding KB/sample | copy GB/s | memory fraction |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        lines.append(f"| {r['config']} | {r['batch_size']} | {r['precision']} | {r['samples_per_s']:,.0f} "
                     f"| {r['flops_per_sample'] / 1e6:.2f} | {r['matmul_gflops_per_s']:.0f} | {r['compute_fraction']:.2f} "
                     f"| {r['bytes_per_sample']['total'] / 1e3:.1f} | {r['bandwidth_gb_per_s']['copy']:.1f} "
                     f"| {r['memory_fraction']:.3f} |")
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="criteo_capped,dlrm_dcnv2_capped", help=f"comma-separated, from {sorted(CONFIGS)}")
    parser.add_argument("--batch_sizes", default="2048,16384")
    parser.add_argument("--precisions", default="fp32,bf16", help="fp32 (tf_dlrm_fp32) and/or bf16 (tf_dlrm_amp)")
    parser.add_argument("--warmup_steps", type=int, default=3)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--window_steps", type=int, default=5)
    parser.add_argument("--matmul_repeats", type=int, default=3, help="runs of the shapes' matmuls per window")
    parser.add_argument("--num_batches", type=int, default=4, help="distinct batches held in memory")
    parser.add_argument("--learning_rate", type=float, default=0.05)
    parser.add_argument("--stream_elements", type=int, default=STREAM_ELEMENTS, help="float32 elements per bandwidth array")
    parser.add_argument("--markdown", default=None, help="write the table to this file")
    parser.add_argument("--work_dir", default=None, help="where the synthetic data goes (default: a temporary directory)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    args.configs = args.configs.split(",")
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    args.precisions = args.precisions.split(",")
    unknown = [c for c in args.configs if c not in CONFIGS] + [p for p in args.precisions if p not in PRECISION_CASES]
    if unknown:
        parser.error(f"unknown configs or precisions {unknown}; expected configs from {sorted(CONFIGS)} and precisions from "
                     f"{list(PRECISION_CASES)}")
    return args


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    from train_throughput import configure_threads

    configure_threads(0, 0)
    measured_commit = commit()  # now: the tree may move on while this runs
    bandwidth = Bandwidth(args.stream_elements)
    records = []
    with tempfile.TemporaryDirectory(prefix="tf_dlrm_roofline_") as temporary:
        for config_name in args.configs:
            for batch_size in args.batch_sizes:
                for record in run_group(args, config_name, batch_size, args.work_dir or temporary, bandwidth):
                    emit(record)
                    records.append(record)
    if args.markdown:
        command = "python benchmarks/roofline.py " + " ".join(argv if argv is not None else sys.argv[1:])
        with open(args.markdown, "w") as handle:
            handle.write(markdown(records, command, measured_commit))
    return records


if __name__ == "__main__":
    main()
