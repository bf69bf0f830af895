r"""Throughput of Criteo preprocessing: local engine (all cores), Spark engine, naive Python baseline.

    python benchmarks/preprocess_throughput.py [--rows=2000000] [--repeats=3] \
        [--engines=local,spark,naive_python] [--frequency_threshold=3]

Generates a raw Criteo-format TSV (``day_0`` layout: label, 13 integers, 26 hex hashes; hashes drawn
from skewed distributions over the Kaggle dataset's per-feature cardinalities, integers and
missing values at Criteo-like rates), then runs each engine ``--repeats`` times on it with
``--split=fraction --test_fraction=0.1``. Each case runs in its own subprocess; its peak memory
is the largest sum of proportional set sizes (PSS: resident memory, pages shared between processes
split among them) over that subprocess and all its children (workers, the Spark JVM), sampled every
50 ms. The Spark figure excludes starting the session. Every engine's output is compared byte for
byte with the local engine's (``identical_to_local``). Other programs running on the machine slow
the figures down: each line also gives the 1-minute load average before the case and the median CPU
seconds per run (the case's process and its local workers; null for Spark, whose Python workers
belong to the JVM).

Prints one JSON object per case and line:
``{"benchmark": "preprocess_throughput", "engine": "local"|"spark"|"naive_python", "rows": ...,
"rows_per_s": {"median": ..., "min": ..., "max": ...}, "peak_rss_mib": ..., ...}``

With ``--work_dir`` the generated file is kept there and reused by later runs with the same ``--rows``.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import psutil

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPOSITORY)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from emit import emit  # noqa: E402

# Per-feature cardinalities of the Criteo Kaggle dataset: the generator draws hashes from these ranges.
KAGGLE_CARDINALITIES = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27,
                        14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]
CATEGORICAL_MISSING = [0.0, 0.0, 0.03, 0.03, 0.0, 0.12, 0.0, 0.0, 0.0, 0.03, 0.0, 0.03, 0.0, 0.0, 0.0, 0.03,
                       0.0, 0.0, 0.44, 0.44, 0.03, 0.0, 0.76, 0.03, 0.44, 0.03]
INTEGER_MISSING = [0.45, 0.0, 0.21, 0.22, 0.03, 0.22, 0.04, 0.0, 0.04, 0.45, 0.04, 0.77, 0.22]
INTEGER_SCALE = [3, 100, 20, 7, 18000, 100, 16, 12, 100, 0.6, 2.7, 1, 8]
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def _decimal(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Non-negative int64 -> (ASCII digits [n, 12] left-aligned, lengths); -1 -> '-1'."""
    negative = values < 0
    magnitude = np.abs(values)
    digits = np.zeros((values.size, 12), dtype=np.uint8)
    lengths = np.maximum(np.floor(np.log10(np.maximum(magnitude, 1))).astype(np.int64) + 1, 1)
    remaining = magnitude.copy()
    for place in range(11, -1, -1):
        digits[:, place] = remaining % 10 + 48
        remaining //= 10
    # right-aligned in 12 -> left-align by rolling each row by its length
    index = (np.arange(12)[None, :] + (12 - lengths)[:, None]) % 12
    digits = np.take_along_axis(digits, index, axis=1)
    digits = np.where(negative[:, None], np.concatenate([np.full((values.size, 1), 45, np.uint8), digits[:, :11]], 1), digits)
    return digits, lengths + negative


def generate(path: str, rows: int, seed: int = 0, chunk: int = 200_000) -> None:
    """Writes ``rows`` Criteo-format TSV rows (vectorised: about 1-2 s per million rows)."""
    generator = np.random.default_rng(seed)
    with open(path, "wb") as stream:
        for begin in range(0, rows, chunk):
            n = min(chunk, rows - begin)
            columns: list[tuple[np.ndarray, np.ndarray]] = []  # (bytes [n, w], lengths [n])
            label = (generator.random(n) < 0.25).astype(np.int64)
            columns.append(_decimal(label))
            for k in range(13):
                value = np.floor(generator.exponential(INTEGER_SCALE[k], n)).astype(np.int64)
                if k == 1:
                    value[generator.random(n) < 0.01] = -1
                digits, lengths = _decimal(value)
                lengths[generator.random(n) < INTEGER_MISSING[k]] = 0
                columns.append((digits, lengths))
            for k, cardinality in enumerate(KAGGLE_CARDINALITIES):
                rank = np.floor(cardinality * generator.random(n) ** 6).astype(np.uint64)
                hashed = ((rank * np.uint64(2654435761) + np.uint64(k * 97 + 13)) % np.uint64(1 << 32)).astype(np.uint32)
                shifts = np.arange(28, -1, -4, dtype=np.uint32)
                text = _HEX[(hashed[:, None] >> shifts) & 15]
                lengths = np.full(n, 8, dtype=np.int64)
                lengths[generator.random(n) < CATEGORICAL_MISSING[k]] = 0
                columns.append((text, lengths))
            widths = np.stack([lengths for _, lengths in columns], axis=1)  # [n, 40]
            row_lengths = widths.sum(axis=1) + 40  # 39 tabs + newline
            row_start = np.concatenate([[0], np.cumsum(row_lengths)[:-1]])
            out = np.full(int(row_lengths.sum()), 9, dtype=np.uint8)
            out[row_start + row_lengths - 1] = 10
            field_start = row_start[:, None] + np.concatenate([np.zeros((n, 1), np.int64), np.cumsum(widths + 1, axis=1)[:, :-1]], 1)
            for column, (text, lengths) in enumerate(columns):
                for place in range(text.shape[1]):
                    present = lengths > place
                    out[field_start[present, column] + place] = text[present, place]
            stream.write(out.tobytes())


# ----------------------------------------------------------------------------- the naive baseline


def naive_preprocess(path: str, output_dir: str, frequency_threshold: int, test_fraction: float) -> None:
    """A straightforward per-line Python transform producing the same files as the engines."""
    from tf_dlrm.data.split_binary import SplitBinaryWriter
    from tf_dlrm.data.layout import nvidia_spec
    from tf_dlrm.spec.format import categorical_dtype_for

    with open(path, "rb") as stream:
        total = sum(1 for _ in stream)
    num_train = total - int(math.floor(total * test_fraction + 0.5))
    counts = [dict() for _ in range(26)]
    with open(path, "r") as stream:
        for number, line in enumerate(stream):
            if number >= num_train:
                break
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 40:
                continue
            for feature, value in enumerate(fields[14:]):
                if value:
                    table = counts[feature]
                    table[value] = table.get(value, 0) + 1
    vocabularies = []
    for table in counts:
        kept = sorted((-count, int(value, 16)) for value, count in table.items() if count >= frequency_threshold)
        by_hash = {format(value, "08x"): index + 2 for index, (_, value) in enumerate(kept)}
        vocabularies.append(by_hash)
    cardinalities = [2 + len(v) for v in vocabularies]
    spec = nvidia_spec(13, cardinalities, base_directory=output_dir)
    splits = {"train": ([], [], [[] for _ in range(26)]), "test": ([], [], [[] for _ in range(26)])}
    with open(path, "r") as stream:
        for number, line in enumerate(stream):
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 40:
                continue
            labels, numerical, categorical = splits["train" if number < num_train else "test"]
            labels.append(int(fields[0]))
            numerical.append([math.log1p(max(int(x), 0)) if x else 0.0 for x in fields[1:14]])
            for feature, value in enumerate(fields[14:]):
                categorical[feature].append(vocabularies[feature].get(value, 1) if value else 0)
    for split, (labels, numerical, categorical) in splits.items():
        with SplitBinaryWriter(spec, split) as writer:
            writer.append(
                np.array(labels),
                np.array(numerical, dtype=np.float64).astype(np.float16).reshape(-1, 13),
                [np.array(c, dtype=categorical_dtype_for(k)) for c, k in zip(categorical, cardinalities)],
            )


# ----------------------------------------------------------------------------- cases


def _run_case(args) -> None:
    """Child process: runs one engine ``--repeats`` times, prints the seconds of each run as JSON."""
    from preprocessing.criteo import PreprocessConfig, preprocess

    spark = None
    if args.case == "spark":
        from preprocessing.spark_engine import make_session

        spark = make_session(args.spark_master, conf={"spark.ui.showConsoleProgress": "false"})
    seconds, cpu_seconds = [], []
    for repeat in range(args.repeats):
        output = os.path.join(args.work_dir, f"out_{args.case}")
        shutil.rmtree(output, ignore_errors=True)
        started, cpu_started = time.perf_counter(), _cpu_seconds()
        if args.case == "naive_python":
            os.makedirs(output)
            naive_preprocess(args.input, output, args.frequency_threshold, 0.1)
        else:
            preprocess(
                PreprocessConfig(
                    inputs=(args.input,), output_dir=output, frequency_threshold=args.frequency_threshold,
                    engine=args.case, num_workers=args.num_workers, spark_master=args.spark_master,
                ),
                spark=spark,
            )
        seconds.append(time.perf_counter() - started)
        cpu_seconds.append(_cpu_seconds() - cpu_started)
    if spark is not None:
        spark.stop()
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu_seconds}))


def _cpu_seconds() -> float:
    """CPU time of this process and its finished children (local workers; not the Spark JVM's)."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _measure(args, case: str) -> tuple[dict, float]:
    """Runs a case in a subprocess, sampling the memory of its whole process tree."""
    command = [sys.executable, os.path.abspath(__file__), f"--case={case}", f"--input={args.input}",
               f"--work_dir={args.work_dir}", f"--repeats={args.repeats}", f"--num_workers={args.num_workers}",
               f"--frequency_threshold={args.frequency_threshold}", f"--spark_master={args.spark_master}"]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPOSITORY)
    root = psutil.Process(child.pid)
    peak = 0
    while child.poll() is None:
        total = 0
        for process in [root] + _children(root):
            try:
                total += _proportional_memory(process)
            except psutil.Error:
                pass  # it just exited
        peak = max(peak, total)
        time.sleep(0.05)
    out, err = child.communicate()
    if child.returncode:
        raise RuntimeError(f"case {case} failed (exit {child.returncode}):\n{err[-4000:]}")
    return json.loads(out.strip().splitlines()[-1]), peak / 2**20


def _children(process) -> list:
    try:
        return process.children(recursive=True)
    except Exception:  # noqa: BLE001 - the tree changes while we look at it
        return []


def _proportional_memory(process) -> int:
    """PSS: forked workers share pages with their parent; PSS counts each shared page once overall."""
    try:
        return process.memory_full_info().pss
    except (AttributeError, psutil.AccessDenied):
        return process.memory_info().rss


def _same_output(left: str, right: str) -> bool:
    for directory, _, names in os.walk(left):
        for name in names:
            if name.endswith(".bin"):
                relative = os.path.relpath(os.path.join(directory, name), left)
                other = os.path.join(right, relative)
                if not os.path.exists(other) or not filecmp.cmp(os.path.join(directory, name), other, shallow=False):
                    return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engines", default="local,spark,naive_python")
    parser.add_argument("--frequency_threshold", type=int, default=3)
    parser.add_argument("--num_workers", type=int, default=0, help="local engine workers (0: all cores)")
    parser.add_argument("--spark_master", default="local[*]")
    parser.add_argument("--work_dir", default=None, help="where the generated file and outputs go (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--input", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        _run_case(args)
        return
    engines = [e for e in args.engines.split(",") if e]
    unknown = sorted(set(engines) - {"local", "spark", "naive_python"})
    if unknown:
        parser.error(f"--engines: unknown engine(s) {unknown}; choose from local, spark, naive_python")
    owned = args.work_dir is None
    args.work_dir = args.work_dir or tempfile.mkdtemp(prefix="preprocess_throughput_")
    os.makedirs(args.work_dir, exist_ok=True)
    try:
        args.input = os.path.join(args.work_dir, "day_0")
        stamp = os.path.join(args.work_dir, "day_0.rows")
        if not (os.path.exists(stamp) and open(stamp).read() == str(args.rows) and os.path.exists(args.input)):
            started = time.perf_counter()
            generate(args.input, args.rows)
            with open(stamp, "w") as stream:
                stream.write(str(args.rows))
            print(f"# generated {args.rows} rows ({os.path.getsize(args.input) / 2**20:.0f} MiB) in "
                  f"{time.perf_counter() - started:.1f}s", file=sys.stderr)
        cores = len(os.sched_getaffinity(0))
        for engine in engines:
            load = os.getloadavg()[0]
            timings, peak = _measure(args, engine)
            rates = [args.rows / s for s in timings["seconds"]]
            record = {
                "benchmark": "preprocess_throughput",
                "engine": engine,
                "rows": args.rows,
                "rows_per_s": {"median": round(statistics.median(rates)), "min": round(min(rates)), "max": round(max(rates))},
                "peak_rss_mib": round(peak, 1),
                "repeats": args.repeats,
                "cores": cores,
                "workers": (args.num_workers or cores) if engine == "local" else (args.spark_master if engine == "spark" else 1),
                "input_mib": round(os.path.getsize(args.input) / 2**20, 1),
                # Spark's Python workers are the JVM's children, not ours: their CPU time is not seen.
                "cpu_s_per_run": None if engine == "spark" else round(statistics.median(timings["cpu_seconds"]), 2),
                "load_avg_1m_before": round(load, 2),
            }
            if engine != "local" and "local" in engines:
                record["identical_to_local"] = _same_output(
                    os.path.join(args.work_dir, "out_local"), os.path.join(args.work_dir, f"out_{engine}")
                )
            emit(record)
    finally:
        if owned and not args.keep:
            shutil.rmtree(args.work_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
