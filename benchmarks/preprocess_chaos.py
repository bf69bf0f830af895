r"""Stop signals at random moments into the preprocessing tools: does every one end cleanly?

    python benchmarks/preprocess_chaos.py --signals=30 --seed=1 [--targets=criteo_local,synthetic,...] \
        [--work_dir=/tmp/preprocess_chaos] [--markdown=benchmarks/results/preprocess_chaos.md]

The tools (``--targets``; the Spark ones only where PySpark imports):

- ``criteo_local``: ``python -m preprocessing.criteo --num_workers=2`` on the real Criteo 1TB sample rows of
  ``../shared/data`` repeated ``--criteo_copies`` times;
- ``criteo_spark``: the same with ``--engine=spark``;
- ``transcode_local`` / ``transcode_spark``: ``python -m tf_dlrm.data.transcode`` on a csv spec of the real
  Kaggle sample rows (repeated ``--csv_copies`` times; vocabularies for C1..C26, ``log1p`` on I1..I13);
- ``synthetic``: ``python -m tf_dlrm.data.synthetic`` on ``feature_specs/synthetic_small.yaml``.

Each tool first runs once uninterrupted into its output directory (its duration scales the moments drawn
below, its files are hashed). Then, ``--signals`` times, a seeded draw picks a tool, a way to stop it and a
moment (a fraction of the uninterrupted duration); the tool is started again on the same output directory,
in a session of its own, and stopped that way:

- ``SIGTERM``: to the tool's process, as ``kill`` sends it;
- ``SIGINT``: to its whole process group, as Ctrl-C in a terminal sends it;
- ``SIGTERM+SIGTERM``, ``SIGINT+SIGINT``, ``SIGINT+SIGTERM``: a second signal a drawn moment after the first.

A run that finished before its signal is reported as missed and another draw is added, so ``--signals``
signals are delivered. For every signal it records how long the session took to end (the tool and every
process of its session: workers, Spark's JVM and Python workers; also any process naming the output
directory), whether that took longer than ``--deadline_s`` (what is left a minute after the signal is
counted and killed), the temporary outputs left
next to the output directory (``.<name>.tmp-*``, ``.<name>.old-*``), files left in the run's own
``TMPDIR`` (where the Spark engines put the code they ship, and the JVM its scratch files), and whether the
earlier output is byte-identical. One JSON line per signal, then a summary line; ``--markdown`` writes
the table.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import hashlib
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import time

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(os.path.dirname(REPO), "shared", "data")
CRITEO_SAMPLE = "criteo_1tb_day0_sample_1k.tsv"
KAGGLE_SAMPLE = "criteo_kaggle_sample_200.csv"
TARGETS = ("criteo_local", "criteo_spark", "transcode_local", "transcode_spark", "synthetic")
KINDS = ("SIGTERM", "SIGINT", "SIGTERM+SIGTERM", "SIGINT+SIGINT", "SIGINT+SIGTERM")
POLL_S = 0.01
WAIT_S = 60.0  # how long a run that missed the deadline is still watched, to report when it did end


@dataclasses.dataclass(frozen=True)
class Draw:
    """One signal of the campaign: which tool, how, and when (all from the seeded generator)."""

    index: int
    target: str
    kind: str
    fraction: float  # of the tool's uninterrupted duration, when the first signal goes
    second_after_s: float  # between the first signal and the second (kinds with two)


def draws(seed: int):
    """An endless seeded stream of draws: the same seed gives the same sequence."""
    generator = random.Random(seed)
    index = 0
    while True:
        # The second signal's delay is log-uniform over 1 ms to 1 s, so that it often lands inside the clean-up
        # the first one started, whose length is unknown in advance.
        yield Draw(index, generator.choice(TARGETS), generator.choice(KINDS), generator.uniform(0.0, 1.0),
                   10 ** generator.uniform(-3.0, 0.0))
        index += 1


# ----------------------------------------------------------------------------- inputs


def write_inputs(work_dir: str, criteo_copies: int, csv_copies: int) -> dict:
    """The real sample rows, repeated into inputs large enough to be interrupted mid-pass."""
    inputs = os.path.join(work_dir, "inputs")
    os.makedirs(inputs, exist_ok=True)
    day = os.path.join(inputs, "day_0.tsv")
    if not os.path.isfile(day):
        with open(os.path.join(SHARED_DATA, CRITEO_SAMPLE), "rb") as handle:
            rows = handle.read()
        with open(day + ".partial", "wb") as handle:
            for _ in range(criteo_copies):
                handle.write(rows)
        os.rename(day + ".partial", day)
    spec = os.path.join(inputs, "kaggle_spec.yaml")
    if not os.path.isfile(spec):
        with open(os.path.join(SHARED_DATA, KAGGLE_SAMPLE), newline="", encoding="utf-8") as handle:
            header, *body = list(csv.reader(handle))
        integers = header[1:14]
        # The transcoder needs a number in every numerical cell (the raw sample leaves some empty).
        lines = [",".join(row[:1] + [cell or "0" for cell in row[1:14]] + row[14:]) for row in body]
        with open(os.path.join(inputs, "kaggle.csv"), "w", encoding="utf-8") as handle:
            handle.write(",".join(header) + "\n")
            for _ in range(csv_copies):
                handle.write("\n".join(lines) + "\n")
        categorical = header[14:]
        features = {header[0]: {"dtype": "bool"}, **{name: {"dtype": "float32"} for name in integers},
                    **{name: {"dtype": "int32"} for name in categorical}}
        chunk = {"type": "csv", "features": header, "files": ["kaggle.csv"], "header": True,
                 "encode": {name: "vocabulary" for name in categorical},
                 "transform": {name: [{"clip": [0, None]}, "log1p"] for name in integers}}
        document = {"feature_spec": features,
                    "channel_spec": {"label": [header[0]], "numerical": integers, "categorical": categorical},
                    "source_spec": {"train": [chunk]}}
        with open(spec, "w", encoding="utf-8") as handle:
            yaml.safe_dump(document, handle, sort_keys=False)
    return {"day": day, "spec": spec}


def command(target: str, inputs: dict, output: str, synthetic_samples: int) -> list[str]:
    python = [sys.executable, "-m"]
    if target.startswith("criteo"):
        return [*python, "preprocessing.criteo", f"--input={inputs['day']}", f"--output_dir={output}",
                "--num_workers=2", f"--engine={target.split('_')[1]}"]
    if target.startswith("transcode"):
        engine = target.split("_")[1]
        # --test_fraction divides rows on the local engine only.
        fraction = ["--test_fraction=0.1"] if engine == "local" else []
        return [*python, "tf_dlrm.data.transcode", f"--input_spec={inputs['spec']}", f"--output_dir={output}",
                f"--engine={engine}", *fraction]
    return [*python, "tf_dlrm.data.synthetic", "--feature_spec=feature_specs/synthetic_small.yaml",
            f"--output_dir={output}", f"--num_train_samples={synthetic_samples}", "--num_valid_samples=20000",
            "--seed=1"]


# ----------------------------------------------------------------------------- what is left


def tree_hash(directory: str) -> str:
    """sha256 over every file's relative path and bytes, in sorted order."""
    digest = hashlib.sha256()
    for root, directories, names in sorted(os.walk(directory)):
        directories.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            digest.update(os.path.relpath(path, directory).encode() + b"\0")
            with open(path, "rb") as handle:
                for piece in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(piece)
    return digest.hexdigest()


def _stat_fields(pid: str) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None


def left_processes(session: int, output: str) -> list[int]:
    """Live processes of ``session``, or whose command line names ``output`` (a process that left the
    session but still works on the output); zombies are not counted."""
    found = []
    needle = output.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        fields = _stat_fields(entry)
        if fields is None or fields[0] == b"Z":
            continue
        if int(fields[3]) == session:
            found.append(int(entry))
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if needle in handle.read():
                    found.append(int(entry))
        except OSError:
            pass
    return found


def temporary_outputs(output: str) -> list[str]:
    parent, name = os.path.split(output)
    return sorted(entry for entry in os.listdir(parent) if entry.startswith((f".{name}.tmp-", f".{name}.old-")))


def entries(directory: str) -> list[str]:
    return sorted(os.listdir(directory)) if os.path.isdir(directory) else []


# ----------------------------------------------------------------------------- one signal


def run_environment(run_dir: str) -> dict:
    """The tool's environment: a TMPDIR of its own, so that what it leaves there can be counted."""
    temporary = os.path.join(run_dir, "tmp")
    shutil.rmtree(temporary, ignore_errors=True)
    os.makedirs(temporary)
    environment = {key: value for key, value in os.environ.items() if key != "SPARK_LOCAL_DIRS"}
    # The JVM ignores TMPDIR: java.io.tmpdir (Spark's scratch files by default) is pointed at it too.
    return {**environment, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2", "TMPDIR": temporary,
            "JAVA_TOOL_OPTIONS": f"-Djava.io.tmpdir={temporary}"}


def baseline(target: str, inputs: dict, work_dir: str, synthetic_samples: int) -> dict:
    """The uninterrupted run: its duration and its output's hash."""
    run_dir = os.path.join(work_dir, target)
    output = os.path.join(run_dir, "out")
    os.makedirs(run_dir, exist_ok=True)
    started = time.monotonic()
    result = subprocess.run(command(target, inputs, output, synthetic_samples), cwd=REPO,
                            env=run_environment(run_dir), capture_output=True, text=True)
    seconds = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"preprocess_chaos: the uninterrupted {target} run failed ({result.returncode}):\n"
                         f"{result.stderr[-3000:]}")
    return {"target": target, "output": output, "seconds": seconds, "hash": tree_hash(output)}


def deliver(process: subprocess.Popen, name: str) -> None:
    """SIGTERM to the process (``kill``); SIGINT to its process group (Ctrl-C in a terminal)."""
    number = signal.Signals[name]
    try:
        if number == signal.SIGINT:
            os.killpg(process.pid, number)
        else:
            process.send_signal(number)
    except ProcessLookupError:
        pass


def one_signal(draw: Draw, reference: dict, inputs: dict, work_dir: str, synthetic_samples: int,
               deadline_s: float) -> dict:
    run_dir = os.path.join(work_dir, draw.target)
    output = reference["output"]
    env = run_environment(run_dir)
    names = draw.kind.split("+")
    with open(os.path.join(run_dir, f"stderr_{draw.index}.txt"), "w+", encoding="utf-8") as errors:
        process = subprocess.Popen(command(draw.target, inputs, output, synthetic_samples), cwd=REPO, env=env,
                                   stdout=subprocess.DEVNULL, stderr=errors, start_new_session=True)
        moment = draw.fraction * reference["seconds"]
        started = time.monotonic()
        while process.poll() is None and time.monotonic() - started < moment:
            time.sleep(POLL_S)
        record = {"signal": draw.index, "target": draw.target, "kind": draw.kind,
                  "at_s": round(time.monotonic() - started, 2)}
        if process.poll() is not None:
            # Finished first (the machine was faster than the uninterrupted run): nothing was tested.
            return {**record, "missed": True, "exit": process.returncode,
                    "output_intact": tree_hash(output) == reference["hash"]}
        signalled = time.monotonic()
        deliver(process, names[0])
        second_sent = len(names) == 1
        ended_s = None
        while time.monotonic() - signalled < WAIT_S:
            if not second_sent and time.monotonic() - signalled >= draw.second_after_s:
                if process.poll() is None:
                    deliver(process, names[1])
                second_sent = True
            if process.poll() is not None and not left_processes(process.pid, output):
                ended_s = time.monotonic() - signalled
                break
            time.sleep(POLL_S)
        left = left_processes(process.pid, output)
        for pid in left:  # still there long after the deadline: end them so the campaign goes on, and count them
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if process.poll() is None:
            process.kill()
        process.wait()
        errors.seek(0)
        lines = [line for line in errors.read().splitlines() if line.strip()]
    return {
        **record,
        "missed": False,
        "second_signal": len(names) == 2 and draw.second_after_s < (ended_s if ended_s is not None else WAIT_S),
        "exit": process.returncode,
        "exit_s": None if ended_s is None else round(ended_s, 3),
        "ended_within_deadline": ended_s is not None and ended_s <= deadline_s,
        "processes_left": len(left),
        "temporary_outputs_left": temporary_outputs(output),
        "tmpdir_left": entries(env["TMPDIR"]),
        "output_intact": tree_hash(output) == reference["hash"],
        "last_line": lines[-1][-200:] if lines else "",
    }


# ----------------------------------------------------------------------------- report


def summary_of(records: list[dict], references: dict) -> dict:
    delivered = [r for r in records if not r["missed"]]
    exits = [r["exit_s"] for r in delivered if r["exit_s"] is not None]
    by_target = {}
    for target in references:
        mine = [r for r in delivered if r["target"] == target]
        by_target[target] = {
            "signals": len(mine),
            "slowest_exit_s": max((r["exit_s"] for r in mine if r["exit_s"] is not None), default=None),
            "over_deadline": sum(not r["ended_within_deadline"] for r in mine),
            "processes_left": sum(r["processes_left"] for r in mine),
            "temporary_outputs_left": sum(len(r["temporary_outputs_left"]) for r in mine),
            "tmpdir_left": sum(len(r["tmpdir_left"]) for r in mine),
            "outputs_damaged": sum(not r["output_intact"] for r in mine),
        }
    return {
        "benchmark": "preprocess_chaos",
        "signals": len(delivered),
        "missed": len(records) - len(delivered),
        "second_signals": sum(r["second_signal"] for r in delivered),
        "slowest_exit_s": max(exits, default=None),
        "over_deadline": sum(not r["ended_within_deadline"] for r in delivered),
        "processes_left": sum(r["processes_left"] for r in delivered),
        "temporary_outputs_left": sum(len(r["temporary_outputs_left"]) for r in delivered),
        "tmpdir_left": sum(len(r["tmpdir_left"]) for r in delivered),
        "outputs_damaged": sum(not r["output_intact"] for r in delivered),
        "by_target": by_target,
        "uninterrupted_s": {target: round(reference["seconds"], 2) for target, reference in references.items()},
    }


def markdown(path: str, records: list[dict], summary: dict, argv: list[str]) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    machine = subprocess.run("lscpu | head -20", shell=True, capture_output=True, text=True).stdout.rstrip()
    lines = [
        "# Stop signals into the preprocessing tools (issue #42, item 3)",
        "",
        f"Commit `{commit}`, command:",
        "",
        "```bash",
        "nice -n 10 python " + " ".join(["benchmarks/preprocess_chaos.py", *argv]),
        "```",
        "",
        "Machine (`lscpu | head -20`; 2 cores shared with other sessions' tests):",
        "",
        "```",
        machine,
        "```",
        "",
        "## Summary",
        "",
        f"- signals delivered: {summary['signals']} ({summary['second_signals']} runs got a second signal before "
        f"ending; {summary['missed']} draws missed: the tool finished first)",
        f"- slowest exit (first signal to the last process of the tool's session gone): {summary['slowest_exit_s']} s",
        f"- runs not ended within the deadline: {summary['over_deadline']}",
        f"- worker processes left: {summary['processes_left']}",
        f"- temporary outputs left (`.<output>.tmp-*`, `.<output>.old-*`): {summary['temporary_outputs_left']}",
        f"- files left in the run's TMPDIR (Spark's shipped code and scratch files): {summary['tmpdir_left']}",
        f"- earlier outputs not byte-identical afterwards: {summary['outputs_damaged']}",
        "",
        "| tool | uninterrupted s | signals | slowest exit s | over deadline | processes left | temporary outputs left "
        "| TMPDIR left | outputs damaged |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for target, row in summary["by_target"].items():
        lines.append(f"| {target} | {summary['uninterrupted_s'][target]} | {row['signals']} | {row['slowest_exit_s']} | "
                     f"{row['over_deadline']} | {row['processes_left']} | {row['temporary_outputs_left']} | "
                     f"{row['tmpdir_left']} | {row['outputs_damaged']} |")
    lines += ["", "## Every signal", "",
              "| # | tool | signal(s) | at s | exit | exit s | left | tool's last line |", "|---|---|---|---|---|---|---|---|"]
    for r in records:
        if r["missed"]:
            lines.append(f"| {r['signal']} | {r['target']} | {r['kind']} | {r['at_s']} | {r['exit']} | missed | | |")
            continue
        left = sum(len(r[key]) for key in ("temporary_outputs_left", "tmpdir_left")) + r["processes_left"]
        last = r["last_line"].replace("|", "\\|")
        lines.append(f"| {r['signal']} | {r['target']} | {r['kind']} | {r['at_s']} | {r['exit']} | {r['exit_s']} | "
                     f"{left} | `{last}` |")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")


def spark_available() -> bool:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return False
    return shutil.which("java") is not None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--signals", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--work_dir", default="/tmp/preprocess_chaos")
    parser.add_argument("--criteo_copies", type=int, default=720, help="copies of the 1,000 real rows")
    parser.add_argument("--csv_copies", type=int, default=1000, help="copies of the 200 real Kaggle rows")
    parser.add_argument("--synthetic_samples", type=int, default=3_000_000)
    parser.add_argument("--deadline_s", type=float, default=5.0, help="a run must end this soon after its signal")
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args()
    targets = [t for t in args.targets.split(",") if t]
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown:
        parser.error(f"--targets: expected names from {list(TARGETS)}. Received: {unknown}")
    if not spark_available():
        skipped = [t for t in targets if t.endswith("_spark")]
        targets = [t for t in targets if not t.endswith("_spark")]
        if skipped:
            print(json.dumps({"skipped": skipped, "reason": "pyspark or java not installed"}), flush=True)
    os.makedirs(args.work_dir, exist_ok=True)
    inputs = write_inputs(args.work_dir, args.criteo_copies, args.csv_copies)
    references = {}
    for target in targets:
        references[target] = baseline(target, inputs, args.work_dir, args.synthetic_samples)
        print(json.dumps({"uninterrupted": target, "seconds": round(references[target]["seconds"], 2)}), flush=True)
    records, delivered = [], 0
    for draw in draws(args.seed):
        if delivered >= args.signals:
            break
        if draw.target not in references:
            continue
        record = one_signal(draw, references[draw.target], inputs, args.work_dir, args.synthetic_samples,
                            args.deadline_s)
        print(json.dumps(record), flush=True)
        records.append(record)
        delivered += not record["missed"]
    summary = summary_of(records, references)
    summary.update(cpu=platform.processor() or platform.machine(), cores=os.cpu_count())
    print(json.dumps(summary), flush=True)
    if args.markdown:
        markdown(args.markdown, records, summary, sys.argv[1:])


if __name__ == "__main__":
    main()
