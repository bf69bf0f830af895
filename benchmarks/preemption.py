r"""SIGTERM during training of the criteo_capped model under ``-np 2``: does every rank save and exit 143?

    python benchmarks/preemption.py --runs=10 [--plain_runs=3] [--burners=2] [--work_dir=/tmp/preemption]

Writes a synthetic dataset of ``feature_specs/criteo_capped.yaml``'s shape once (26 tables up to 100,000
rows, dim 128: 1.3 GB of tables, 3.9 GB with lazy Adam's two slots), starts ``--burners`` processes that
keep a core busy each, then runs the job ``--runs`` times under ``python -m tf_dlrm.cli.launch`` and
``--plain_runs`` times under plain ``horovodrun``. Each run is signalled (SIGTERM to the launcher, or to
horovodrun) once rank 0 has printed its progress line of step 5; each rank runs under
``tests/bad_inputs/exit_recorder.py``, which records the rank's own exit status. A run passes when both
ranks exit 143, rank 0 prints one ``interrupted at step N`` line, and the checkpoint of step N verifies
(every file's size and sha256) and holds step N; the last passing run's checkpoint is also restored by
``--mode=eval`` on 2 ranks. One JSON line per run and a summary line go to stdout.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tf_dlrm.checkpoint import store  # noqa: E402

HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")
RECORDER = os.path.join(REPO, "tests", "bad_inputs", "exit_recorder.py")
MODEL = ["--embedding_dim=128", "--bottom_mlp_dims=512,256,128", "--top_mlp_dims=1024,1024,512,256,1",
         "--batch_size=2048", "--epochs=100", "--evals_per_epoch=0", "--print_freq=5"]
LINE = re.compile(r"interrupted at step (\d+); last checkpoint: (\S+)")


def burn() -> None:
    while True:
        pass


def one_run(launcher: bool, data: str, directory: str) -> dict:
    save, codes = os.path.join(directory, "save"), os.path.join(directory, "codes")
    os.makedirs(codes)
    ranks = ["-np", "2", "-H", "localhost:2", "--gloo", sys.executable, RECORDER, codes, sys.executable, "main.py",
             f"--dataset_path={data}", *MODEL, f"--save_checkpoint_path={save}"]
    command = [sys.executable, "-m", "tf_dlrm.cli.launch", *ranks] if launcher else [HOROVODRUN, *ranks]
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}
    started = time.time()
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, ready = [], threading.Event()

    def collect():
        for line in process.stdout:
            lines.append(line)
            if re.search(r"step\s+5\b.* loss ", line) or re.search(r"\b5/\d+.* loss ", line):
                ready.set()

    reader = threading.Thread(target=collect, daemon=True)
    reader.start()
    if not ready.wait(900):
        process.kill()
        return {"error": "no progress line of step 5", "tail": "".join(lines)[-2000:]}
    signalled = time.time()
    process.send_signal(signal.SIGTERM)
    code = process.wait(timeout=900)
    reader.join(timeout=30)
    output = "".join(lines)
    exits = {name: int(open(os.path.join(codes, name)).read()) for name in sorted(os.listdir(codes))}
    found = LINE.findall(output)
    record = {"launcher": "tf_dlrm.cli.launch" if launcher else "horovodrun", "exit": code, "rank_exits": exits,
              "interrupted_lines": len(found), "seconds_to_signal": round(signalled - started, 1),
              "seconds_after_signal": round(time.time() - signalled, 1)}
    if len(found) == 1:
        step, path = int(found[0][0]), found[0][1]
        try:
            manifest = store.read_manifest(path)
            store.verify_files(path, manifest)
            record.update(step=step, checkpoint=path, verified=manifest["step"] == step)
        except (store.CheckpointError, OSError) as error:
            record.update(step=step, checkpoint=path, verified=False, error=str(error))
    record["ok"] = exits == {"rank0": 143, "rank1": 143} and len(found) == 1 and record.get("verified", False)
    if not record["ok"]:
        record["tail"] = output[-1500:]
    return record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--plain_runs", type=int, default=3)
    parser.add_argument("--burners", type=int, default=2)
    parser.add_argument("--work_dir", default="/tmp/preemption")
    parser.add_argument("--num_train_samples", type=int, default=100_000)
    args = parser.parse_args()
    data = os.path.join(args.work_dir, "data")
    if not os.path.isfile(os.path.join(data, "feature_spec.yaml")):
        subprocess.run([sys.executable, "-m", "tf_dlrm.data.synthetic", "--feature_spec=feature_specs/criteo_capped.yaml",
                        f"--output_dir={data}", f"--num_train_samples={args.num_train_samples}", "--num_valid_samples=4096",
                        "--seed=1"], cwd=REPO, check=True, env={**os.environ, "PYTHONPATH": REPO})
    burners = [multiprocessing.Process(target=burn, daemon=True) for _ in range(args.burners)]
    for burner in burners:
        burner.start()
    records = []
    try:
        plan = [True] * args.runs + [False] * args.plain_runs
        for index, launcher in enumerate(plan):
            directory = os.path.join(args.work_dir, f"run{index}_{int(time.time())}")
            record = {"run": index, **one_run(launcher, data, directory)}
            print(json.dumps(record), flush=True)
            records.append(record)
            if record.get("ok"):
                last_ok = record
        if any(r.get("ok") for r in records):
            last_ok = [r for r in records if r.get("ok")][-1]
            evaluated = subprocess.run(
                [HOROVODRUN, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, "main.py", f"--dataset_path={data}",
                 *MODEL, "--mode=eval", f"--restore_checkpoint_path={last_ok['checkpoint']}"],
                cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO})
            restored = re.search(r"restored checkpoint \S+ \(step \d+\)", evaluated.stdout + evaluated.stderr)
            print(json.dumps({"restore_check": last_ok["checkpoint"], "exit": evaluated.returncode,
                              "line": restored.group(0) if restored else None}), flush=True)
    finally:
        for burner in burners:
            burner.terminate()
    summary = {}
    for name in ("tf_dlrm.cli.launch", "horovodrun"):
        mine = [r for r in records if r.get("launcher") == name]
        summary[name] = f"{sum(bool(r.get('ok')) for r in mine)} of {len(mine)}"
    print(json.dumps({"summary": summary, "burners": args.burners, "cpu": platform.processor() or platform.machine(),
                      "cores": os.cpu_count()}), flush=True)


if __name__ == "__main__":
    main()
