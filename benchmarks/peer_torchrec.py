r"""tf_dlrm against TorchRec (PyTorch, CPU) on the same model, batches and table optimizer, taking turns.

    python benchmarks/peer_torchrec.py [--peer_python=../peer/trvenv/bin/python] [--config=criteo_capped] \
        [--optimizers=sgd,adagrad,rowwise_adagrad] [--threads=1,2] [--torch_variants=stock,mkl_intel_path] [--rounds=3]

TorchRec runs in its own virtual environment outside this project (``benchmarks/README.md`` has the install
line); this file is both the driver, run with tf_dlrm's Python, and, with ``--role=torchrec``, the TorchRec
worker, run with the peer's Python (only that role imports torch). With no peer Python, or one without
TorchRec, the script says so in one line and exits 0.

The model is DLRM with the dot interaction (``torchrec.models.dlrm.DLRM``: the bottom MLP, ReLU on every
layer, the strict lower triangle of pairwise dot products next to the bottom output, the top MLP with a linear
logit), or for ``--config=dlrm_dcnv2_capped`` MLPerf's DLRM-DCNv2 (``torchrec.models.dlrm.DLRM_DCN``: low-rank
cross layers over the bottom output and the pooled embeddings, as tf_dlrm's ``--interaction=cross``), on an
``EmbeddingBagCollection`` of the config's tables (sum pooling), sharded by
``DistributedModelParallel`` on a one-process gloo group, every table table-wise with the table optimizer fused into
the backward (``apply_optimizer_in_backward``: FBGEMM's CPU TBE); the MLPs train with plain SGD, as tf_dlrm's do. The
batches are the config's synthetic dataset (``train_throughput.py``'s, seed ``--seed``), read once and
written for the worker: both frameworks train on the same samples. Each worker trains one model per
optimizer, taking turns among them, after ``--warmup_steps``; each framework reports the dense multiply-adds
per sample of its own model (the driver checks they agree: the same model) and the matmul rate it reaches at
those shapes (forward, input and weight gradient at the batch size, fp32).

A round runs, for each thread count, tf_dlrm and each TorchRec variant in turn (the order alternates between
rounds), each pinned to the same ``threads`` cores (``taskset``) with ``threads`` intra-op threads.

The matmul rate beside the ratio is there because TorchRec's dense layers run on torch's MKL, which on a
non-Intel CPU takes its generic AVX2 path (MKL checks the vendor; ``MKL_DEBUG_CPU_TYPE=5``, the old override,
is ignored by MKL 2020 Update 1 and later, which torch ships). The variant ``mkl_intel_path`` preloads a
library whose ``mkl_serv_intel_cpu_true`` answers yes (compiled here with ``cc``), so MKL picks its AVX-512
code as on an Intel CPU: the ratio on an even matmul footing. ``stock`` is torch as installed. On a machine other
jobs share, torch's OpenMP threads spin at every barrier and two of them can stall each other for whole time slices:
``OMP_WAIT_POLICY=PASSIVE`` in the environment makes them sleep instead (TensorFlow's threads are its own pool).

Prints one JSON line per worker run (``"benchmark": "peer_torchrec_run"``) and one summary line per thread
count, optimizer and variant (``"benchmark": "peer_torchrec"``): the medians over rounds of both rates,
``tf_dlrm_over_torchrec`` and both frameworks' matmul GFLOP/s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = os.environ.get("TF_DLRM_PEER_DIR") or os.path.join(os.path.dirname(REPOSITORY), "peer")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad")
# tf_dlrm's train_throughput case training with each table optimizer (MLPs on SGD in all).
TF_CASES = {"sgd": "tf_dlrm_fp32", "adagrad": "tf_dlrm_adagrad", "rowwise_adagrad": "tf_dlrm_rowwise_adagrad"}
VARIANTS = ("stock", "mkl_intel_path")
# MKL asks this function whether the CPU is Intel's; answering yes gives AMD CPUs MKL's AVX-512 kernels.
MKL_SHIM_SOURCE = "int mkl_serv_intel_cpu_true(void) { return 1; }\n"


# ---------------------------------------------------------------------------------------------- the driver


def peer_status(peer_python: str) -> str | None:
    """None when ``peer_python`` imports TorchRec; otherwise why not, in a few words."""
    if not os.path.isfile(peer_python):
        return f"no peer Python at {peer_python}"
    done = subprocess.run([peer_python, "-c", "import torchrec, fbgemm_gpu"], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return f"{peer_python} cannot import torchrec and fbgemm_gpu: {done.stderr.strip().splitlines()[-1:]}"
    return None


def build_mkl_shim(directory: str) -> str:
    source = os.path.join(directory, "mkl_intel_path.c")
    library = os.path.join(directory, "mkl_intel_path.so")
    with open(source, "w") as handle:
        handle.write(MKL_SHIM_SOURCE)
    subprocess.run([shutil.which("cc") or "cc", "-shared", "-fPIC", "-O2", "-o", library, source], check=True)
    return library


def write_batches(config_name: str, config, work_dir: str, num_batches: int, seed: int) -> tuple[str, dict]:
    """The config's synthetic batches for the TorchRec worker (tf_dlrm reads the same dataset), and the
    model's shape as plain data."""
    import numpy as np

    from train_throughput import make_dataset, read_batches

    spec = make_dataset(config, os.path.join(work_dir, f"{config_name}_train"), config.batch_size * num_batches, seed)
    batches = read_batches(spec, config.batch_size, num_batches)
    arrays = {"numerical": np.stack([n for n, _, _ in batches]).astype(np.float32),
              "label": np.stack([l for _, _, l in batches]).astype(np.float32)}
    features = spec.categorical_features
    for t, feature in enumerate(features):
        arrays[f"ids_{t}"] = np.stack([np.asarray(ids[t]).reshape(config.batch_size, -1) for _, ids, _ in batches]).astype(np.int64)
    path = os.path.join(work_dir, f"{config_name}_batches.npz")
    np.savez(path, **arrays)
    params = dict(config.params)
    shape = {"rows": spec.cardinalities(), "hotness": [spec.hotness(f) for f in features],
             "combiners": [spec.combiner(f) for f in features], "embedding_dim": config.embedding_dim,
             "num_numerical": len(spec.numerical_features), "bottom_mlp_dims": list(config.bottom_mlp_dims),
             "top_mlp_dims": list(config.top_mlp_dims), "batch_size": config.batch_size,
             "interaction": params.get("interaction", "dot"), "num_cross_layers": params.get("num_cross_layers", 0),
             "cross_low_rank": params.get("cross_low_rank", 0)}
    return path, shape


def pinned(threads: int) -> list[str]:
    """``taskset`` onto the first ``threads`` cores this process may use (the same cores for both frameworks)."""
    cores = sorted(os.sched_getaffinity(0))[:threads]
    return ["taskset", "-c", ",".join(str(c) for c in cores)] if shutil.which("taskset") else []


def run_worker(command: list[str], environment: dict, timeout: int) -> dict:
    done = subprocess.run(command, cwd=REPOSITORY, env=environment, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"a worker failed (exit {done.returncode}): {' '.join(command)}\n{(done.stdout + done.stderr)[-3000:]}")
    return json.loads(lines[-1])


def worker_arguments(args, threads: int) -> list[str]:
    return [f"--config={args.config}", f"--threads={threads}", f"--optimizers={','.join(args.optimizers)}",
            f"--warmup_steps={args.warmup_steps}", f"--windows={args.windows}", f"--window_steps={args.window_steps}",
            f"--learning_rate={args.learning_rate}", f"--num_batches={args.num_batches}", f"--seed={args.seed}",
            f"--work_dir={args.work_dir}", f"--batch_size={args.batch_size}"]


def summaries(runs: list[dict], args) -> list[dict]:
    """Medians over rounds per thread count, optimizer and TorchRec variant, and their ratio."""
    out = []
    for threads in args.threads:
        mine = [r for r in runs if r["framework"] == "tf_dlrm" and r["threads"] == threads]
        for variant in args.torch_variants:
            theirs = [r for r in runs if r["framework"] == "torchrec" and r["variant"] == variant and r["threads"] == threads]
            for optimizer in args.optimizers:
                tf_rate = statistics.median(r["samples_per_s"][optimizer] for r in mine)
                torch_rate = statistics.median(r["samples_per_s"][optimizer] for r in theirs)
                out.append({
                    "benchmark": "peer_torchrec", "config": args.config, "batch_size": runs[0]["batch_size"],
                    "threads": threads, "optimizer": optimizer, "torchrec_variant": variant, "rounds": args.rounds,
                    "tf_dlrm_samples_per_s": round(tf_rate, 1), "torchrec_samples_per_s": round(torch_rate, 1),
                    "tf_dlrm_over_torchrec": round(tf_rate / torch_rate, 3),
                    "tf_matmul_gflops_per_s": round(statistics.median(r["matmul_gflops_per_s"] for r in mine), 1),
                    "torch_matmul_gflops_per_s": round(statistics.median(r["matmul_gflops_per_s"] for r in theirs), 1),
                    "torch": theirs[0]["versions"],
                })
    return out


def drive(args) -> list[dict]:
    from emit import emit
    from train_throughput import CONFIGS

    missing = peer_status(args.peer_python)
    if missing:
        print(f"peer_torchrec: skipped, TorchRec is not set up ({missing}); see benchmarks/README.md")
        return []
    config = CONFIGS[args.config]
    params = dict(config.params)
    if config.model != "dlrm" or params.get("interaction", "dot") not in ("dot", "cross") or (
            params.get("interaction") == "cross" and not params.get("cross_low_rank")):
        raise SystemExit(f"Expected a DLRM config with the dot interaction or low-rank cross layers (TorchRec's DLRM and "
                         f"DLRM_DCN are the same models only for those). Received: --config={args.config}")
    if args.batch_size:
        import dataclasses

        config = dataclasses.replace(config, batch_size=args.batch_size)
    with tempfile.TemporaryDirectory(prefix="tf_dlrm_torchrec_") as temporary:
        args.work_dir = args.work_dir or temporary
        batches, shape = write_batches(args.config, config, args.work_dir, args.num_batches, args.seed)
        shape_path = os.path.join(args.work_dir, f"{args.config}_shape.json")
        with open(shape_path, "w") as handle:
            json.dump(shape, handle)
        shim = build_mkl_shim(args.work_dir) if "mkl_intel_path" in args.torch_variants else None
        runs = []
        for round_index in range(args.rounds):
            for threads in args.threads:
                environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
                turns = [("tf_dlrm", None)] + [("torchrec", v) for v in args.torch_variants]
                if round_index % 2:
                    turns.reverse()
                for framework, variant in turns:
                    if framework == "tf_dlrm":
                        command = [*pinned(threads), sys.executable, os.path.abspath(__file__), "--role=tf_dlrm",
                                   *worker_arguments(args, threads)]
                        env = dict(environment, PYTHONPATH=REPOSITORY + os.pathsep + os.environ.get("PYTHONPATH", ""))
                    else:
                        command = [*pinned(threads), args.peer_python, os.path.abspath(__file__), "--role=torchrec",
                                   *worker_arguments(args, threads), f"--batches={batches}", f"--shape={shape_path}"]
                        env = dict(environment, LD_PRELOAD=shim) if variant == "mkl_intel_path" else dict(environment)
                        env.pop("PYTHONPATH", None)  # the peer's Python imports nothing of this project
                    record = run_worker(command, env, args.timeout)
                    record.update({"benchmark": "peer_torchrec_run", "config": args.config, "round": round_index,
                                   "variant": variant, "load_average_1m": round(os.getloadavg()[0], 2)})
                    emit(record)
                    runs.append(record)
    macs = {r["dense_macs_per_sample"] for r in runs}
    if len(macs) != 1:
        raise SystemExit(f"The two models differ: dense multiply-adds per sample {sorted(macs)}")
    out = summaries(runs, args)
    for record in out:
        record["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        emit(record)
    return out


# ------------------------------------------------------------------------------------ tf_dlrm's worker


def tf_dlrm_worker(args) -> None:
    """One process at ``--threads``: one tf_dlrm model per optimizer, taking turns; prints one JSON line."""
    import dataclasses

    from roofline import MatmulRate, model_cost
    from train_throughput import CONFIGS, Case, configure_threads, make_dataset, measure, read_batches

    [threads] = args.threads
    configure_threads(threads, threads)
    config = CONFIGS[args.config]
    if args.batch_size:
        config = dataclasses.replace(config, batch_size=args.batch_size)
    spec = make_dataset(config, os.path.join(args.work_dir, f"{args.config}_train"), config.batch_size * args.num_batches, args.seed)
    batches = read_batches(spec, config.batch_size, args.num_batches)
    cases = [Case(TF_CASES[o], config, spec, batches, args.learning_rate, args.seed) for o in args.optimizers]
    measure(cases, args.warmup_steps, args.windows, args.window_steps)
    cost = model_cost(cases[0].model, spec, config.embedding_dim, 4)
    matmul = MatmulRate(cost.matmul_shapes, config.batch_size, "fp32")
    rate = statistics.median(matmul.measure(1) for _ in range(3))
    print(json.dumps({"framework": "tf_dlrm", "threads": threads, "batch_size": config.batch_size,
                      "samples_per_s": {o: statistics.median(c.windows) for o, c in zip(args.optimizers, cases)},
                      "dense_macs_per_sample": cost.dense_macs, "matmul_gflops_per_s": rate / 1e9}), flush=True)


# ------------------------------------------------------------------------------ TorchRec's worker (peer venv)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrec_worker(args) -> None:
    """One process at ``--threads``: one TorchRec DLRM per optimizer, taking turns; prints one JSON line."""
    import numpy as np
    import torch
    import torch.distributed as dist
    import torchrec
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import ShardingType
    from torchrec.models.dlrm import DLRM, DLRM_DCN
    from torchrec.modules.embedding_configs import PoolingType
    from torchrec.optim import RowWiseAdagrad
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    [threads] = args.threads
    torch.set_num_threads(threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    with open(args.shape) as handle:
        shape = json.load(handle)
    if any(c != "sum" for c in shape["combiners"]):
        raise SystemExit(f"Expected sum pooling on every table. Received: {shape['combiners']}")
    data = np.load(args.batches)
    keys = [f"f{t}" for t in range(len(shape["rows"]))]
    batch = shape["batch_size"]
    inputs = []
    for b in range(data["numerical"].shape[0]):
        ids = [data[f"ids_{t}"][b] for t in range(len(keys))]  # [batch, hotness] each: fixed hotness
        sparse = KeyedJaggedTensor.from_lengths_sync(
            keys=keys, values=torch.from_numpy(np.concatenate([i.reshape(-1) for i in ids])),
            lengths=torch.from_numpy(np.concatenate([np.full(batch, i.shape[1], np.int32) for i in ids])))
        inputs.append((torch.from_numpy(data["numerical"][b]), sparse, torch.from_numpy(data["label"][b]).reshape(batch, 1)))
    table_optimizers = {"sgd": (torch.optim.SGD, {"lr": args.learning_rate}),
                        "adagrad": (torch.optim.Adagrad, {"lr": args.learning_rate}),
                        "rowwise_adagrad": (RowWiseAdagrad, {"lr": args.learning_rate})}

    def build(optimizer: str):
        tables = [torchrec.EmbeddingBagConfig(name=f"t{t}", embedding_dim=shape["embedding_dim"], num_embeddings=rows,
                                              feature_names=[keys[t]], pooling=PoolingType.SUM)
                  for t, rows in enumerate(shape["rows"])]
        collection = torchrec.EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
        if shape["interaction"] == "cross":  # MLPerf's DLRM-DCNv2, as NVIDIA's dcnv2.py and tf_dlrm's --interaction=cross
            model = DLRM_DCN(embedding_bag_collection=collection, dense_in_features=shape["num_numerical"],
                             dense_arch_layer_sizes=shape["bottom_mlp_dims"], over_arch_layer_sizes=shape["top_mlp_dims"],
                             dcn_num_layers=shape["num_cross_layers"], dcn_low_rank_dim=shape["cross_low_rank"])
        else:
            model = DLRM(embedding_bag_collection=collection, dense_in_features=shape["num_numerical"],
                         dense_arch_layer_sizes=shape["bottom_mlp_dims"], over_arch_layer_sizes=shape["top_mlp_dims"])
        optimizer_class, keywords = table_optimizers[optimizer]
        apply_optimizer_in_backward(optimizer_class, model.sparse_arch.parameters(), keywords)
        # Every table table-wise on the fused kernel: the planner's own choice replicates small tables
        # (data_parallel), and those the optimizer-in-backward leaves unchanged, where tf_dlrm updates all.
        constraints = {f"t{t}": ParameterConstraints(sharding_types=[ShardingType.TABLE_WISE.value],
                                                     compute_kernels=[EmbeddingComputeKernel.FUSED.value])
                       for t in range(len(keys))}
        planner = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"), batch_size=batch,
                                           constraints=constraints)
        plan = planner.collective_plan(model, pg=dist.GroupMember.WORLD)
        model = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan)
        dense = [p for name, p in model.named_parameters() if "sparse_arch" not in name]
        return model, torch.optim.SGD(dense, lr=args.learning_rate)

    models = [build(o) for o in args.optimizers]
    loss_function = torch.nn.BCEWithLogitsLoss()
    positions = [0] * len(models)

    def run(index: int, steps: int) -> float:
        model, optimizer = models[index]
        started = time.perf_counter()
        for _ in range(steps):
            numerical, sparse, label = inputs[positions[index] % len(inputs)]
            positions[index] += 1
            optimizer.zero_grad()
            loss = loss_function(model(numerical, sparse), label)
            loss.backward()
            optimizer.step()
        loss.item()
        return steps * batch / (time.perf_counter() - started)

    windows = [[] for _ in models]
    for index in range(len(models)):
        run(index, args.warmup_steps)
    for _ in range(args.windows):
        for index in range(len(models)):
            windows[index].append(run(index, args.window_steps))
    shapes = [tuple(p.shape) for name, p in models[0][0].named_parameters() if "sparse_arch" not in name and p.dim() == 2]
    print(json.dumps({"framework": "torchrec", "threads": threads, "batch_size": batch,
                      "samples_per_s": {o: statistics.median(w) for o, w in zip(args.optimizers, windows)},
                      "dense_macs_per_sample": sum(o * i for o, i in shapes),
                      "matmul_gflops_per_s": torch_matmul_rate(shapes, batch) / 1e9,
                      "versions": {"torch": torch.__version__, "torchrec": getattr(torchrec, "__version__", "?"),
                                   "mkl_preloaded": "mkl_intel_path" in os.environ.get("LD_PRELOAD", "")}}), flush=True)
    dist.destroy_process_group()


def torch_matmul_rate(shapes, batch: int) -> float:
    """torch's fp32 matmul FLOP/s at the Linear weights' shapes ``(out, in)``: forward, input and weight gradient."""
    import torch

    generator = torch.Generator().manual_seed(0)
    operands = [(torch.rand(batch, i, generator=generator), torch.rand(o, i, generator=generator), torch.rand(batch, o, generator=generator))
                for o, i in shapes]
    flops = 3 * 2 * batch * sum(o * i for o, i in shapes)

    def once() -> float:
        started = time.perf_counter()
        for x, w, dy in operands:
            x @ w.t(), dy @ w, dy.t() @ x
        return flops / (time.perf_counter() - started)

    once()
    return statistics.median(once() for _ in range(3))


# ------------------------------------------------------------------------------------------------------ CLI


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--role", default="driver", choices=["driver", "tf_dlrm", "torchrec"], help=argparse.SUPPRESS)
    parser.add_argument("--peer_python", default=os.path.join(PEER, "trvenv", "bin", "python"),
                        help="python of a virtual environment with torch (CPU), torchrec and fbgemm-gpu-cpu, outside this project")
    parser.add_argument("--config", default="criteo_capped")
    parser.add_argument("--batch_size", type=int, default=0, help="global batch (0: the config's)")
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS), help=f"table optimizers, from {list(OPTIMIZERS)}")
    parser.add_argument("--threads", default="1,2", help="thread counts (each run pinned to that many cores)")
    parser.add_argument("--torch_variants", default=",".join(VARIANTS), help=f"from {list(VARIANTS)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup_steps", type=int, default=3)
    parser.add_argument("--windows", type=int, default=3, help="windows per optimizer in one worker run")
    parser.add_argument("--window_steps", type=int, default=3)
    parser.add_argument("--num_batches", type=int, default=4, help="distinct batches, the same for both")
    parser.add_argument("--learning_rate", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--work_dir", default=None, help="where the batches go (default: a temporary directory)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds for one worker run")
    parser.add_argument("--batches", help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.optimizers = args.optimizers.split(",")
    args.threads = [int(t) for t in str(args.threads).split(",")]
    args.torch_variants = args.torch_variants.split(",")
    unknown = [o for o in args.optimizers if o not in OPTIMIZERS] + [v for v in args.torch_variants if v not in VARIANTS]
    if unknown or min(args.threads) < 1 or args.rounds < 1:
        parser.error(f"Expected optimizers from {list(OPTIMIZERS)}, variants from {list(VARIANTS)}, threads and rounds >= 1. "
                     f"Received: {unknown or ''} --threads={args.threads} --rounds={args.rounds}")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.role == "torchrec":
        return torchrec_worker(args)
    if args.role == "tf_dlrm":
        return tf_dlrm_worker(args)
    return drive(args)


if __name__ == "__main__":
    main()
