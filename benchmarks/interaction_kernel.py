r"""The dot interaction alone: tf_dlrm's CPU kernel against the generic TensorFlow path, one process.

    python benchmarks/interaction_kernel.py [--batch_size=2048] [--tables=26] [--dims=16,128] [--windows=7]

For each dim, times forward + gradient of :class:`tf_dlrm.models.layers.interaction.DotInteraction` (a
``tf.function`` with a GradientTape, on random inputs) with the kernel and with the generic path
(one batched matmul + one gather of the triangle, hand-written gradient), taking turns window by
window. Also times the kernel's forward alone. Prints one JSON object per dim and line:
``{"benchmark": "interaction_kernel", "dim": ..., "batch_size": ..., "tables": ...,
"kernel_ms": {"median", "min", "max"}, "generic_ms": {...}, "kernel_forward_ms": {...},
"speedup": generic median / kernel median}`` (milliseconds per forward + gradient), for float32 and
for bfloat16 inputs (``--precisions``; the kernel widens bf16 to float32 inside and rounds once).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from emit import emit  # noqa: E402


def summarize(values) -> dict:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch_size", type=int, default=2048)
    parser.add_argument("--tables", type=int, default=26)
    parser.add_argument("--dims", default="16,128")
    parser.add_argument("--windows", type=int, default=7)
    parser.add_argument("--window_steps", type=int, default=50)
    parser.add_argument("--precisions", default="fp32,bf16", help="fp32 and/or bf16 (mixed_bfloat16 inputs)")
    args = parser.parse_args(argv)

    import numpy as np
    import tensorflow as tf

    from tf_dlrm.models.layers.interaction import DotInteraction
    from tf_dlrm.ops import kernels
    from tf_dlrm.cli.session import configure_threads

    if kernels() is None:
        raise SystemExit("the kernel is not built: python -m tf_dlrm.ops.build")
    configure_threads(types.SimpleNamespace(intra_op_parallelism=0, inter_op_parallelism=0), 1)
    out = []
    cases = [(dim, precision) for dim in (int(d) for d in args.dims.split(",")) for precision in args.precisions.split(",")]
    for dim, precision in cases:
        dtype, policy = (tf.bfloat16, "mixed_bfloat16") if precision == "bf16" else (tf.float32, "float32")
        rng = np.random.default_rng(dim)
        bottom = tf.cast(rng.standard_normal((args.batch_size, dim)), dtype)
        embeddings = tf.cast(rng.standard_normal((args.batch_size, args.tables, dim)), dtype)
        width = dim + (args.tables + 1) * args.tables // 2
        upstream = tf.cast(rng.standard_normal((args.batch_size, width)), dtype)
        steps = {}
        for name, use_kernel in (("kernel", True), ("generic", False)):
            layer = DotInteraction(dtype=policy)
            layer.use_kernel = use_kernel

            # Returns the output too: otherwise Grappler prunes the forward pass the gradient does not read.
            @tf.function
            def step(bottom, embeddings, layer=layer):
                with tf.GradientTape() as tape:
                    tape.watch([bottom, embeddings])
                    interactions = layer((bottom, embeddings))
                return interactions, tape.gradient(interactions, [bottom, embeddings], output_gradients=upstream)

            steps[name] = step
        forward = DotInteraction(dtype=policy)
        steps["kernel_forward"] = tf.function(lambda bottom, embeddings: forward((bottom, embeddings)))
        times = {name: [] for name in steps}
        for step in steps.values():
            tf.nest.map_structure(lambda t: t.numpy(), step(bottom, embeddings))
        for _ in range(args.windows):
            for name, step in steps.items():
                started = time.perf_counter()
                for _ in range(args.window_steps):
                    result = step(bottom, embeddings)
                tf.nest.map_structure(lambda t: t.numpy(), result)
                times[name].append((time.perf_counter() - started) / args.window_steps * 1e3)
        record = {
            "benchmark": "interaction_kernel", "precision": precision, "dim": dim, "batch_size": args.batch_size, "tables": args.tables,
            "kernel_ms": summarize(times["kernel"]), "generic_ms": summarize(times["generic"]),
            "kernel_forward_ms": summarize(times["kernel_forward"]),
            "speedup": round(statistics.median(times["generic"]) / statistics.median(times["kernel"]), 3),
        }
        emit(record)
        out.append(record)
    return out


if __name__ == "__main__":
    main()
