r"""A fault campaign against one small training job: does every fault leave the model as if nothing happened?

    python benchmarks/chaos.py --faults=30 --seed=1 [--faults_per_round=10] [--work_dir=/tmp/chaos] \
        [--markdown=benchmarks/results/chaos.md]

The job: a DLRM (dim 16, MLPs 64-16 and 64-32-1, batch 1024) on a synthetic dataset of
``feature_specs/synthetic_small.yaml`` (``--train_samples``, 128 steps an epoch by default, ``--epochs``), 2 ranks,
a checkpoint every ``--checkpoint_every_steps`` into a directory on a small tmpfs (``--tmpfs_mib``; where
``mount -t tmpfs`` is refused the full-disk fault is left out and the run says so). It runs once uninterrupted
through ``python -m tf_dlrm.cli.launch`` (the reference AUC; ``--reference_alongside``: at the same time as the
first round, which its faults then meet on a busier machine), then in rounds of up to ``--faults_per_round`` faults
(those a round's training has finished before go to the next round), each round one training from step 0, launched alternately through ``python -m tf_dlrm.cli.launch`` and
``scripts/train_resilient.sh``. Faults are drawn with ``--seed`` (kind, and how many steps after the job's current
step it strikes), so a failing draw can be replayed:

- ``rank_sigkill``: SIGKILL to one rank;
- ``launcher_sigterm``, ``launcher_sigint``: to the launcher's process (the launch module, or the script);
- ``launcher_sigkill``: SIGKILL to the launcher's process alone;
- ``disk_full``: the checkpoint filesystem filled to within 64 KiB of full, freed again once a save was due;
- ``crash_corrupt_newest``: every process of the job SIGKILLed and the newest checkpoint's largest file truncated
  to half, as a machine crash in the middle of writing it would leave it (when it was the only one, ``--resume``
  refuses, and the restart adds ``--restart_if_all_corrupt`` as docs/checkpoints.md says);
- ``rank_sigstop``: one rank frozen (SIGSTOP) for 2-8 s, then thawed;
- ``rank_frozen``: one rank frozen for good (SIGSTOP, no SIGCONT): the job must end by itself within
  ``FROZEN_BOUND_S`` (its peer's collective times out, Gloo's 30 s, and horovodrun kills the frozen rank), with one
  line, and is restarted as after a lost rank;
- ``data_replaced``: the training split's ``label.bin`` replaced (by a rename, as the dataset tools publish) with
  other labels; put back when a restart refuses it, or at the round's end.
- ``data_overwritten``: the same labels written over ``label.bin`` in place (the running ranks read the new bytes): the
  ranks must refuse them at their next read and stop; the original is put back (by a rename) before the restart.

After a fault the job is restarted the way docs/training.md says: when it ended, the same command with
``--resume`` (a stop by the launcher's signal, a lost rank under the launch module, a crash); after a lost rank
``scripts/train_resilient.sh`` restarts it itself on the ranks that remain; processes of a job whose launcher was
killed are stopped the documented way first (SIGTERM to the ranks, which save and exit). Before every restart and at
each round's end every listed checkpoint (``ckpt-<step>`` with a manifest) must verify (sizes and checksums), apart
from the one the crash fault truncated on purpose (``--resume`` must set it aside). A round passes when its final AUC
equals the uninterrupted run's within ``--auc_tolerance`` (1e-4: a resume is exact, docs/checkpoints.md), or, when
``train_resilient.sh`` went on with fewer ranks (sums in another order: different arithmetic), within 3 Hanley-McNeil
standard errors of the validation split (docs/testing.md).

Per fault: whether the job got going again (progress 16 steps past the step it was at), restarts, steps lost (the step at
the fault minus the step the next attempt resumed from), wall time lost (from the fault until the job passed that
step again). One JSON line per fault and per round, a summary line; ``--markdown`` writes the tables.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import json
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tf_dlrm.checkpoint import store  # noqa: E402

HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")
KINDS = ("rank_sigkill", "launcher_sigterm", "launcher_sigint", "launcher_sigkill", "disk_full",
         "crash_corrupt_newest", "rank_sigstop", "rank_frozen", "data_replaced",
         "data_overwritten")
DATA_KINDS = ("data_replaced", "data_overwritten")  # faults that change the dataset every run reads
LAUNCHERS = ("launch", "train_resilient")
PRINT_FREQ = 8
# Going again means passing the fault's step by this much: a rank can run ahead of a dead peer by a step at most (every
# step ends in an allreduce), so progress this far is the job's, not a dying rank's last line.
GOING_AGAIN_STEPS = 2 * PRINT_FREQ
MODEL = ["--embedding_dim=16", "--bottom_mlp_dims=64,16", "--top_mlp_dims=64,32,1", "--batch_size=1024",
         "--evals_per_epoch=0", f"--print_freq={PRINT_FREQ}", "--stop_timeout_s=20", "--seed=7"]
PROGRESS = re.compile(r"\] (\d+)/(\d+)\s+loss ")
RESTORED = re.compile(r"restored checkpoint \S+ \(step (\d+)\)")
OWN_RESTART = re.compile(r"train_resilient\.sh: attempt [2-9]")
FRESH = re.compile(r"no (?:intact )?checkpoint under .* yet")
REFUSED_DATA = re.compile(r"different training split|trained on a different|changed under the running job")
ALL_CORRUPT = "--resume found only corrupt checkpoints"
VALID_SAMPLES = 16384
FAULT_TIMEOUT_S = 300.0  # a fault whose job is not going again by then did not survive
ORPHAN_GRACE_S = 10.0
# A rank frozen for good: its peers' next collective fails after HOROVOD_GLOO_TIMEOUT_SECONDS (30 s), horovodrun then
# SIGKILLs the frozen rank (within 10 s); the rest is a loaded machine's margin.
FROZEN_BOUND_S = 120.0


@dataclasses.dataclass(frozen=True)
class Fault:
    index: int
    kind: str
    after_steps: int  # strikes this many steps after the job's current step (seen on a progress line) ...
    delay_s: float  # ... and this long after that line, so that it may hit any moment of a step
    seconds: float  # rank_sigstop: how long the rank stays frozen


def draw_faults(count: int, seed: int, kinds) -> list[Fault]:
    generator = random.Random(seed)
    return [Fault(index, generator.choice(kinds), generator.randint(4, 40),
                  generator.uniform(0.0, 1.0), generator.uniform(2.0, 8.0)) for index in range(count)]


# ----------------------------------------------------------------------------- processes


def processes_naming(marker: str) -> list[int]:
    """Live processes whose command line holds ``marker``: a job's launcher, horovodrun, and ranks all name the job's
    checkpoint directory, also once a killed launcher left them without a parent (horovodrun runs in a session of
    its own under the launch module, so neither the session nor the process tree finds them)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                if handle.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
        except (OSError, IndexError):
            continue
        if marker in command_line(int(entry)):
            found.append(int(entry))
    return found


def command_line(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return [part.decode(errors="replace") for part in handle.read().split(b"\0") if part]
    except OSError:
        return []


def is_rank(pid: int) -> bool:
    argv = command_line(pid)
    return len(argv) > 1 and "python" in os.path.basename(argv[0]) and argv[1].endswith("main.py")


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (stopped counts; a zombie, ended but not reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def send(pid: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, number)


class Job:
    """One launch of the training command; a thread reads its output and follows its step."""

    def __init__(self, argv: list[str], env: dict, transcript: str, marker: str):
        self.argv = argv
        self.marker = marker
        self.started = time.monotonic()
        self.process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, errors="replace", start_new_session=True)
        self.step = 0
        self.lines: list[str] = []
        self.progress: list[tuple[float, int]] = []  # (monotonic time, step)
        self.resumed: list[tuple[float, int]] = []  # (time, step restored from; 0: started afresh), one per attempt
        self.own_restarts: list[float] = []  # when train_resilient.sh restarted the job by itself
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, args=(transcript,), daemon=True)
        self.reader.start()

    def _read(self, transcript: str) -> None:
        with open(transcript, "a", encoding="utf-8") as out:
            out.write("$ " + " ".join(self.argv) + "\n")
            for line in self.process.stdout:
                out.write(line)
                now = time.monotonic()
                with self.lock:
                    self.lines.append(line)
                    if match := PROGRESS.search(line):
                        self.step = int(match.group(1))
                        self.progress.append((now, self.step))
                    elif match := RESTORED.search(line):
                        self.step = int(match.group(1))
                        self.resumed.append((now, self.step))
                    elif FRESH.search(line):
                        self.step = 0
                        self.resumed.append((now, 0))
                    elif OWN_RESTART.search(line):
                        self.own_restarts.append(now)

    def ended(self) -> bool:
        return self.process.poll() is not None

    def text(self) -> str:
        with self.lock:
            return "".join(self.lines)

    def processes(self) -> list[int]:
        return processes_naming(self.marker)

    def ranks(self) -> list[int]:
        return sorted(pid for pid in self.processes() if is_rank(pid))

    def wait_for_step(self, step: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.step >= step:
                return True
            if self.ended():
                self.reader.join(5)
                return self.step >= step
            time.sleep(0.05)
        return False

    def passed_after(self, step: int, since: float) -> float | None:
        """When a progress line past ``step`` came after ``since``."""
        with self.lock:
            return next((when for when, seen in self.progress if when > since and seen > step), None)

    def finish(self, timeout: float) -> int | None:
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self.reader.join(10)
        return code

    def kill_all(self) -> None:
        for pid in self.processes():
            send(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)


# ----------------------------------------------------------------------------- the campaign


class Campaign:
    def __init__(self, args, data: str, checkpoint_root: str, mounted: bool):
        self.args = args
        self.data = data
        self.checkpoint_root = checkpoint_root
        self.mounted = mounted
        self.env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2", "HOROVODRUN": HOROVODRUN,
                    "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
        self.transcripts = os.path.join(args.work_dir, "transcripts")
        os.makedirs(self.transcripts, exist_ok=True)

    def training(self, save: str, log: str) -> list[str]:
        return [sys.executable, "main.py", f"--dataset_path={self.data}", *MODEL, f"--epochs={self.args.epochs}",
                f"--checkpoint_every_steps={self.args.checkpoint_every_steps}", f"--save_checkpoint_path={save}",
                f"--log_path={log}"]

    def launch(self, launcher: str, save: str, log: str, name: str, extra: list[str] = ()) -> Job:
        training = [*self.training(save, log), "--resume", *extra]  # an empty directory is no error: step 0
        if launcher == "launch":
            argv = [sys.executable, "-m", "tf_dlrm.cli.launch", "-np", "2", "-H", "localhost:2", "--gloo", *training]
        else:
            argv = ["bash", os.path.join(REPO, "scripts", "train_resilient.sh"), "--np", "2", "--max_restarts", "3",
                    "--", *training]
        return Job(argv, self.env, os.path.join(self.transcripts, f"{name}.txt"), f"--save_checkpoint_path={save}")

    def uninterrupted(self) -> dict:
        save = os.path.join(self.args.work_dir, "uninterrupted")
        shutil.rmtree(save, ignore_errors=True)
        log = os.path.join(self.args.work_dir, "uninterrupted.jsonl")
        started = time.monotonic()
        job = self.launch("launch", save, log, "uninterrupted")
        code = job.finish(1800)
        if code != 0:
            raise SystemExit(f"chaos: the uninterrupted run failed ({code}):\n{job.text()[-3000:]}")
        return {"auc": final_record(log)["auc"], "seconds": time.monotonic() - started}

    # --------------------------------------------------------------- one round

    def run_round(self, number: int, faults: list[Fault], reference) -> tuple[dict, list[dict], list[Fault]]:
        """One training from step 0 with ``faults``; those it had no time for (it finished) are returned.
        ``reference()``: the uninterrupted run's ``{"auc", "seconds"}`` (waits for it when it runs alongside)."""
        launcher = self.args.launchers[number % len(self.args.launchers)]
        save = os.path.join(self.checkpoint_root, f"round{number}")
        for entry in os.listdir(self.checkpoint_root):  # earlier rounds' checkpoints would fill the small disk
            shutil.rmtree(os.path.join(self.checkpoint_root, entry), ignore_errors=True)
        self.attempt = 0
        self.round_name = f"round{number}"
        self.log = os.path.join(self.args.work_dir, f"round{number}_attempt%d.jsonl")
        self.save, self.launcher = save, launcher
        self.final_step = self.args.epochs * (self.args.train_samples // 1024)
        self.replaced_label: str | None = None
        self.truncated: set[str] = set()
        self.half_written: list[str] = []
        self.restart_times: list[float] = []  # the campaign's restarts and train_resilient.sh's own
        self.shrunk = False
        started = time.monotonic()
        job = self.start()
        records, left = [], []
        for fault in faults:
            if left or (job.ended() and job.finish(10) == 0):
                left.append(fault)  # the training had finished: the next round takes it
                continue
            job, record = self.one_fault(job, fault)
            if not record.get("injected"):
                left.append(fault)
                continue
            record.update(fault=fault.index, round=number, launcher=launcher)
            print(json.dumps(record), flush=True)
            records.append(record)
        job = self.to_the_end(job)
        self.restart_times += job.own_restarts
        self.shrunk = self.shrunk or bool(job.own_restarts)
        self.put_back_data()
        self.check_listed()
        final = final_record(self.log % self.attempt)
        reference_auc = reference()["auc"]
        # On fewer ranks the sums run in another order: then the AUC is compared within 3 Hanley-McNeil standard errors
        # (docs/testing.md, trainings in different arithmetic), else within --auc_tolerance (a resume is exact).
        positives = round(final["positive_rate"] * VALID_SAMPLES)
        tolerance = (3 * hanley_mcneil(reference_auc, positives, VALID_SAMPLES - positives) if self.shrunk
                     else self.args.auc_tolerance)
        summary = {"round": number, "launcher": launcher, "faults": len(records), "carried_over": len(left),
                   "restarts": len(self.restart_times), "final_step": final["steps"], "auc": final["auc"],
                   "reference_auc": reference_auc, "auc_difference": abs(final["auc"] - reference_auc),
                   "fewer_ranks": self.shrunk, "tolerance": tolerance,
                   "auc_equal": abs(final["auc"] - reference_auc) <= tolerance,
                   "half_written_listed": self.half_written, "seconds": round(time.monotonic() - started, 1)}
        return summary, records, left

    def start(self, extra: list[str] = ()) -> Job:
        self.attempt += 1
        name = f"{self.round_name}_attempt{self.attempt}"
        return self.launch(self.launcher, self.save, self.log % self.attempt, name, extra)

    def restart(self, job: Job) -> Job:
        """The documented restart of an ended job: nothing of it left running, then the same command with --resume."""
        self.stop_orphans(job)
        if REFUSED_DATA.search(job.text()[-4000:]):
            self.put_back_data()  # the operator puts back the data the checkpoints were trained on
        # Every checkpoint corrupt: --resume refuses (exit 2); the documented answer is to start over explicitly.
        start_over = ALL_CORRUPT in job.text()[-6000:]
        self.check_listed()
        self.restart_times += [*job.own_restarts, time.monotonic()]  # its own restarts, and this one
        self.shrunk = self.shrunk or bool(job.own_restarts)  # train_resilient.sh went on with fewer ranks
        return self.start(["--restart_if_all_corrupt"] if start_over else [])

    def stop_orphans(self, job: Job) -> int:
        """Ranks still running after their launcher ended: stopped as docs/training.md says (SIGTERM, they save)."""
        deadline = time.monotonic() + ORPHAN_GRACE_S
        while job.processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        left = job.processes()
        if left:
            for pid in job.ranks():
                send(pid, signal.SIGTERM)
            deadline = time.monotonic() + 60
            while job.processes() and time.monotonic() < deadline:
                time.sleep(0.1)
            job.kill_all()
        return len(left)

    def check_listed(self) -> None:
        """Every listed checkpoint verifies, except one this campaign truncated (until --resume sets it aside)."""
        for _, path in store.list_checkpoints(self.save):
            if path in self.truncated:
                continue
            try:
                store.verify_files(path, store.read_manifest(path))
            except (store.CheckpointError, OSError) as error:
                self.half_written.append(f"{path}: {error}")

    def to_the_end(self, job: Job) -> Job:
        for _ in range(6):
            code = job.finish(1800)
            if code == 0 and os.path.isfile(self.log % self.attempt):
                return job
            job = self.restart(job)
        raise SystemExit(f"chaos: {self.round_name} did not finish after 6 restarts:\n{job.text()[-3000:]}")

    # --------------------------------------------------------------- one fault

    def one_fault(self, job: Job, fault: Fault) -> tuple[Job, dict]:
        target = job.step + fault.after_steps
        if fault.kind == "disk_full":  # strike just before a save, so that the save meets the full disk
            every = self.args.checkpoint_every_steps
            target = max(job.step + 1, (target // every + 1) * every - 4)
        if not job.wait_for_step(target, FAULT_TIMEOUT_S) or job.ended():
            if job.ended() and job.finish(10) == 0:
                return job, {"kind": fault.kind, "injected": False, "reason": "the training had finished"}
        if fault.kind != "disk_full":  # that one must strike before the save
            time.sleep(fault.delay_s)
        step, struck = job.step, time.monotonic()
        record = {"kind": fault.kind, "injected": True, "step": step}
        moved = getattr(self, f"_{fault.kind}")(job, fault, record)
        if moved is not None:  # the fault struck later than it was set off (the full disk: at the next save)
            step, struck = moved
            record["step"] = step
        handled = time.monotonic()  # progress lines before this are the faulty job's own (orphans, a frozen rank)
        job, survived = self.until_going(job, step, struck, handled)
        survived = survived and record.get("bounded", True)  # a frozen rank must end the job by itself
        resumed = [restored for when, restored in job.resumed if when > struck]
        regained = job.passed_after(min(step + GOING_AGAIN_STEPS, self.final_step - 1), handled)
        record.update(
            survived=survived,
            restarts=sum(when > struck for when in [*self.restart_times, *job.own_restarts]),
            resumed_from=resumed[0] if resumed else None,
            # The step at the fault is the last one printed: a clean stop may save a few steps past it.
            steps_lost=max(0, step - resumed[0]) if resumed else 0,
            wall_s_lost=round(regained - struck, 1) if regained is not None else None,
        )
        return job, record

    def until_going(self, job: Job, step: int, struck: float, since: float) -> tuple[Job, bool]:
        """Restarts the job as often as it ends, until it passes ``step`` again after ``since`` (or the fault's time
        is up)."""
        deadline = struck + FAULT_TIMEOUT_S
        while time.monotonic() < deadline:
            if job.passed_after(min(step + GOING_AGAIN_STEPS, self.final_step - 1), since) is not None:
                return job, True
            if job.ended():
                code = job.finish(10)
                if code == 0 and os.path.isfile(self.log % self.attempt):
                    return job, True  # it finished meanwhile
                job = self.restart(job)
            time.sleep(0.1)
        job.kill_all()
        return self.restart(job), False

    def _rank_sigkill(self, job: Job, fault: Fault, record: dict) -> None:
        ranks = job.ranks()
        record["rank_pid"] = ranks[fault.index % len(ranks)] if ranks else None
        if ranks:
            send(record["rank_pid"], signal.SIGKILL)

    def _launcher_signal(self, job: Job, number: int, record: dict) -> None:
        send(job.process.pid, number)
        code = job.finish(120)
        record["launcher_exit"] = code
        record["interrupted_line"] = "interrupted at step" in job.text()

    def _launcher_sigterm(self, job: Job, fault: Fault, record: dict) -> None:
        self._launcher_signal(job, signal.SIGTERM, record)

    def _launcher_sigint(self, job: Job, fault: Fault, record: dict) -> None:
        self._launcher_signal(job, signal.SIGINT, record)

    def _launcher_sigkill(self, job: Job, fault: Fault, record: dict) -> None:
        send(job.process.pid, signal.SIGKILL)
        job.process.wait()
        time.sleep(2.0)
        # What is still running trains on unattended: no one would stop it on a preemption, and a restart beside it
        # would be a second job on the same checkpoints. It is stopped the documented way before the restart.
        record["orphans_left"] = len(job.processes())
        self.stop_orphans(job)

    def _disk_full(self, job: Job, fault: Fault, record: dict) -> tuple[int, float] | None:
        if not self.mounted:
            record["skipped"] = "no tmpfs"
            return
        filler = os.path.join(self.checkpoint_root, "filler")
        free = os.statvfs(self.checkpoint_root)
        size = max(0, free.f_bavail * free.f_frsize - (64 << 10))
        with open(filler, "wb") as handle:
            try:
                for start in range(0, size, 1 << 20):
                    handle.write(b"\0" * min(1 << 20, size - start))
                    handle.flush()
            except OSError as error:  # full before the margin (tmpfs counts whole pages): full is the aim
                if error.errno != errno.ENOSPC:
                    raise
        every = self.args.checkpoint_every_steps
        due = (job.step // every + 1) * every
        job.wait_for_step(due + 1, 120)  # the save was due, and met the full disk
        record["save_due_step"] = due
        record["job_ended"] = job.ended()
        record["message"] = next((line.strip() for line in job.text().splitlines()[::-1]
                                  if "No space left" in line or "ENOSPC" in line), None)
        os.remove(filler)
        return due, time.monotonic()

    def _crash_corrupt_newest(self, job: Job, fault: Fault, record: dict) -> None:
        job.kill_all()
        newest = store.latest_checkpoint(self.save)
        record["truncated"] = None
        if newest is not None:
            largest = max((os.path.join(root, name) for root, _, names in os.walk(newest) for name in names),
                          key=os.path.getsize)
            with open(largest, "r+b") as handle:
                handle.truncate(os.path.getsize(largest) // 2)
            self.truncated.add(newest)
            record["truncated"] = os.path.relpath(largest, self.save)

    def _rank_sigstop(self, job: Job, fault: Fault, record: dict) -> None:
        ranks = job.ranks()
        if not ranks:
            return
        pid = ranks[fault.index % len(ranks)]
        send(pid, signal.SIGSTOP)
        time.sleep(fault.seconds)
        send(pid, signal.SIGCONT)
        record["frozen_s"] = round(fault.seconds, 1)

    def _rank_frozen(self, job: Job, fault: Fault, record: dict) -> None:
        ranks = job.ranks()
        if not ranks:
            return
        pid = ranks[fault.index % len(ranks)]
        record["rank_pid"] = pid
        lines_before = len(job.lines)
        send(pid, signal.SIGSTOP)
        frozen = time.monotonic()
        while time.monotonic() - frozen < FROZEN_BOUND_S and alive(pid):
            time.sleep(0.2)
        record["bounded"] = not alive(pid)
        record["ended_s"] = round(time.monotonic() - frozen, 1) if record["bounded"] else None
        with job.lock:
            after = job.lines[lines_before:]
        record["message"] = next((line.strip() for line in after if "error (rank" in line), None)
        if alive(pid):  # not ended by the job itself: not survived; the campaign ends it to go on
            send(pid, signal.SIGKILL)
            send(pid, signal.SIGCONT)

    def _data_replaced(self, job: Job, fault: Fault, record: dict) -> None:
        labels = os.path.join(self.data, "train", "label.bin")
        self.put_back_data()  # replaced already: this fault replaces it anew
        os.link(labels, labels + ".original")
        other = np.fromfile(labels, dtype=np.uint8) ^ 1
        other.tofile(labels + ".new")
        os.rename(labels + ".new", labels)
        self.replaced_label = labels
        record["replaced"] = os.path.relpath(labels, self.data)

    def _data_overwritten(self, job: Job, fault: Fault, record: dict) -> None:
        labels = os.path.join(self.data, "train", "label.bin")
        self.put_back_data()
        shutil.copyfile(labels, labels + ".original")  # a copy: the writes below change the file itself
        other = np.fromfile(labels, dtype=np.uint8) ^ 1
        with open(labels, "r+b") as handle:
            handle.write(other.tobytes())
        self.replaced_label = labels
        record["overwritten"] = os.path.relpath(labels, self.data)
        written = time.monotonic()
        job.wait_for_step(10**9, 60)  # until the ranks stop (or 60 s)
        record["message"] = next((line.strip() for line in job.text().splitlines()[::-1]
                                  if "changed under the running job" in line), None)
        # The ranks must have refused the new bytes (and stopped), or finished without reading the split again.
        record["bounded"] = job.ended() and (record["message"] is not None or job.finish(10) == 0)
        record["ended_s"] = round(time.monotonic() - written, 1) if job.ended() else None
        if job.ended():
            self.put_back_data()  # what the line says to do before --resume

    def put_back_data(self) -> None:
        if self.replaced_label is not None:
            os.rename(self.replaced_label + ".original", self.replaced_label)
            self.replaced_label = None


class Reference:
    """The uninterrupted run's ``{"auc", "seconds"}``: ``--reference_auc``, or the run, before the rounds or (with
    ``--reference_alongside``) at the same time as the first, in a thread; calling the object waits for it."""

    def __init__(self, campaign: Campaign, args):
        self.result: dict | None = None
        self.failure: BaseException | None = None
        if args.reference_auc is not None:
            self._done({"auc": args.reference_auc, "seconds": 0.0})
        self.thread = threading.Thread(target=self._run, args=(campaign,), daemon=True)
        if args.reference_auc is None and args.reference_alongside:
            self.thread.start()
        elif args.reference_auc is None:
            self._run(campaign)

    def _run(self, campaign: Campaign) -> None:
        try:
            self._done(campaign.uninterrupted())
        except BaseException as error:  # noqa: BLE001: raised again where the result is wanted
            self.failure = error

    def _done(self, result: dict) -> None:
        self.result = result
        print(json.dumps({"uninterrupted_auc": result["auc"], "seconds": round(result["seconds"], 1)}), flush=True)

    def __call__(self) -> dict:
        if self.thread.is_alive():
            self.thread.join()
        if self.failure is not None:
            raise self.failure
        if self.result is None:
            raise SystemExit("chaos: the uninterrupted run did not end")
        return self.result


def hanley_mcneil(auc: float, positives: int, negatives: int) -> float:
    """The standard error of an AUC on ``positives`` and ``negatives`` (Hanley and McNeil 1982, eq. 2)."""
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    variance = (auc * (1 - auc) + (positives - 1) * (q1 - auc * auc) + (negatives - 1) * (q2 - auc * auc))
    return (variance / (positives * negatives)) ** 0.5


def final_record(log: str) -> dict:
    with open(log, encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    return next(r for r in reversed(records) if r.get("event") == "final")


# ----------------------------------------------------------------------------- set-up and report


def mount_tmpfs(path: str, mebibytes: int) -> bool:
    os.makedirs(path, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mebibytes}m", "tmpfs", path],
                            capture_output=True, text=True)
    return result.returncode == 0


def unmount(path: str) -> None:
    subprocess.run(["umount", path], capture_output=True)


def make_data(args) -> str:
    data = os.path.join(args.work_dir, "data")
    if not os.path.isfile(os.path.join(data, "feature_spec.yaml")):
        subprocess.run([sys.executable, "-m", "tf_dlrm.data.synthetic", "--feature_spec=feature_specs/synthetic_small.yaml",
                        f"--output_dir={data}", f"--num_train_samples={args.train_samples}",
                        f"--num_valid_samples={VALID_SAMPLES}", "--seed=1"],
                       cwd=REPO, check=True, capture_output=True, env={**os.environ, "PYTHONPATH": REPO})
    return data


def summarize(rounds: list[dict], records: list[dict], reference: dict, wall_s: float) -> dict:
    injected = [r for r in records if r.get("injected")]
    by_kind = {}
    for kind in KINDS:
        mine = [r for r in injected if r["kind"] == kind]
        if mine:
            lost = [r["steps_lost"] for r in mine]
            walls = [r["wall_s_lost"] for r in mine if r["wall_s_lost"] is not None]
            by_kind[kind] = {"injected": len(mine), "survived": sum(r["survived"] for r in mine),
                             "restarts": sum(r["restarts"] for r in mine), "steps_lost_max": max(lost),
                             "steps_lost_mean": round(sum(lost) / len(lost), 1),
                             "wall_s_lost_mean": round(sum(walls) / len(walls), 1) if walls else None,
                             "wall_s_lost_max": max(walls) if walls else None}
    return {"benchmark": "chaos", "faults": len(injected), "survived": sum(r["survived"] for r in injected),
            "restarts": sum(r["restarts"] for r in rounds), "rounds": len(rounds),
            "rounds_auc_equal": sum(r["auc_equal"] for r in rounds),
            "half_written_listed": sum(len(r["half_written_listed"]) for r in rounds),
            "reference_auc": reference["auc"], "uninterrupted_s": round(reference["seconds"], 1),
            "wall_s": round(wall_s, 1), "by_kind": by_kind}


def markdown(path: str, rounds, records, summary, argv, mounted: bool) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    machine = subprocess.run("lscpu | head -20", shell=True, capture_output=True, text=True).stdout.rstrip()
    lines = [
        "# A fault campaign against a training job (issue #42, item 2)", "",
        f"Commit `{commit}`, command:", "", "```bash", "nice -n 10 python " + " ".join(["benchmarks/chaos.py", *argv]),
        "```", "", "Machine (`lscpu | head -20`; 2 cores shared with other sessions' tests):", "", "```", machine, "```", "",
        "## Summary", "",
        f"- faults injected: {summary['faults']}, survived: {summary['survived']} (the job passed the step it was at "
        f"again); restarts: {summary['restarts']}",
        f"- rounds: {summary['rounds']}; final AUC equal to the uninterrupted run's ({summary['reference_auc']:.6f}, "
        f"{summary['uninterrupted_s']} s) within the tolerance: {summary['rounds_auc_equal']} of {summary['rounds']}",
        f"- half-written or corrupt checkpoints listed: {summary['half_written_listed']}",
        f"- campaign wall time: {summary['wall_s']} s",
        "" if mounted else "- `mount -t tmpfs` was refused here: the full-disk fault was left out",
        "", "| fault | injected | survived | restarts | steps lost (mean / max) | wall s lost (mean / max) |",
        "|---|---|---|---|---|---|",
    ]
    for kind, row in summary["by_kind"].items():
        lines.append(f"| {kind} | {row['injected']} | {row['survived']} | {row['restarts']} | "
                     f"{row['steps_lost_mean']} / {row['steps_lost_max']} | {row['wall_s_lost_mean']} / {row['wall_s_lost_max']} |")
    lines += ["", "## Rounds", "", "| round | launcher | faults | restarts | final step | AUC | uninterrupted AUC | difference | "
              "fewer ranks | tolerance | equal | s |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rounds:
        lines.append(f"| {r['round']} | {r['launcher']} | {r['faults']} | {r['restarts']} | {r['final_step']} | "
                     f"{r['auc']:.9f} | {r['reference_auc']:.9f} | {r['auc_difference']:.2e} | {r['fewer_ranks']} | "
                     f"{r['tolerance']:.2e} | {r['auc_equal']} | {r['seconds']} |")
    lines += ["", "## Every fault", "", "| # | round | launcher | fault | at step | survived | restarts | resumed from | "
              "steps lost | wall s lost | notes |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        if not r.get("injected"):
            lines.append(f"| {r['fault']} | {r['round']} | {r['launcher']} | {r['kind']} | | not injected: {r['reason']} | | | | | |")
            continue
        notes = {key: r[key] for key in ("launcher_exit", "interrupted_line", "orphans_left", "save_due_step", "job_ended",
                                          "ended_s", "bounded",
                                          "message", "truncated", "frozen_s", "rank_pid", "skipped") if key in r}
        lines.append(f"| {r['fault']} | {r['round']} | {r['launcher']} | {r['kind']} | {r['step']} | {r['survived']} | "
                     f"{r['restarts']} | {r['resumed_from']} | {r['steps_lost']} | {r['wall_s_lost']} | "
                     f"`{json.dumps(notes)}` |".replace("|`{}`|", "| |"))
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults_per_round", type=int, default=10, help="at most; what a round has no time for goes on")
    parser.add_argument("--max_rounds", type=int, default=8)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--work_dir", default="/tmp/chaos")
    parser.add_argument("--train_samples", type=int, default=131072)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--checkpoint_every_steps", type=int, default=32)
    parser.add_argument("--tmpfs_mib", type=int, default=24, help="0: no tmpfs (and no full-disk fault)")
    parser.add_argument("--auc_tolerance", type=float, default=1e-4)
    parser.add_argument("--launchers", default=",".join(LAUNCHERS), help="taken in turn, one a round")
    parser.add_argument("--reference_auc", type=float, default=None,
                        help="the uninterrupted run's AUC from an earlier run of the same settings (skips that run)")
    parser.add_argument("--reference_alongside", action="store_true",
                        help="run the uninterrupted run at the same time as the first round (sooner, but a loaded "
                             "machine for that round's faults); refused with the kinds that change the data")
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args()
    args.launchers = [name for name in args.launchers.split(",") if name]
    if not args.launchers or sorted(set(args.launchers) - set(LAUNCHERS)):
        parser.error(f"--launchers: expected names from {list(LAUNCHERS)}. Received: {args.launchers}")
    kinds = [k for k in args.kinds.split(",") if k]
    if sorted(set(kinds) - set(KINDS)):
        parser.error(f"--kinds: expected names from {list(KINDS)}. Received: {args.kinds}")
    touching_data = sorted(set(kinds) & set(DATA_KINDS))
    if args.reference_alongside and args.reference_auc is None and touching_data:
        parser.error(f"--reference_alongside: the uninterrupted run would read the data that {touching_data} change")
    os.makedirs(args.work_dir, exist_ok=True)
    started = time.monotonic()
    data = make_data(args)
    checkpoint_root = os.path.join(args.work_dir, "checkpoints")
    os.makedirs(checkpoint_root, exist_ok=True)
    mounted = args.tmpfs_mib > 0 and mount_tmpfs(checkpoint_root, args.tmpfs_mib)
    if not mounted and "disk_full" in kinds:
        kinds.remove("disk_full")
        reason = "--tmpfs_mib=0" if args.tmpfs_mib <= 0 else "mount -t tmpfs was refused"
        print(json.dumps({"skipped": "disk_full", "reason": reason}), flush=True)
    faults = draw_faults(args.faults, args.seed, kinds)
    rounds, records = [], []
    try:
        campaign = Campaign(args, data, checkpoint_root, mounted)
        reference = Reference(campaign, args)
        pending, number = list(faults), 0
        while pending and number < args.max_rounds:
            batch, pending = pending[:args.faults_per_round], pending[args.faults_per_round:]
            summary, mine, left = campaign.run_round(number, batch, reference)
            pending = left + pending
            print(json.dumps(summary), flush=True)
            rounds.append(summary)
            records += mine
            number += 1
    finally:
        for pid in os.listdir("/proc"):  # a job the campaign left running (it failed) holds files in the mount
            if pid.isdigit() and any(part.startswith((f"--save_checkpoint_path={checkpoint_root}",
                                                      f"--save_checkpoint_path={os.path.join(args.work_dir, 'uninterrupted')}"))
                                     for part in command_line(int(pid))):
                send(int(pid), signal.SIGKILL)
        if mounted:
            time.sleep(1.0)
            unmount(checkpoint_root)
    summary = summarize(rounds, records, reference(), time.monotonic() - started)
    summary.update(cpu=platform.processor() or platform.machine(), cores=os.cpu_count())
    print(json.dumps(summary), flush=True)
    if args.markdown:
        markdown(args.markdown, rounds, records, summary, sys.argv[1:], mounted)
    if summary["survived"] < summary["faults"] or summary["rounds_auc_equal"] < len(rounds) or summary["half_written_listed"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
