"""``python -m tf_dlrm.cli.launch -np N -H ... python main.py ...``: horovodrun that a preemption
does not cut short.

horovodrun (0.28.1) answers SIGTERM or SIGINT by terminating every rank and SIGKILLing those still
alive 5 s later (``GRACEFUL_TERMINATION_TIME_S``): a rank saving the checkpoint of a large model is
killed half-way, and the run ends with no ``interrupted at step N`` line and no checkpoint of that
step. This launcher takes the same arguments as horovodrun and runs it in a session of its own, so
a signal meant for the job (``kill PID``, Ctrl-C, a scheduler signalling the launcher's process
group) reaches the launcher only. The launcher then sends SIGTERM to each rank on this host
directly and leaves horovodrun alone: the ranks agree on a step, save, print one line and exit 143,
and horovodrun ends with them. A second signal is passed to horovodrun itself (its own quick stop).

Ranks on other hosts get no signal from this host (horovodrun's SIGTERM ends only its local ssh
clients). They are reached through the checkpoint directory, which every host sees (shared storage,
as a job on several machines needs for its checkpoints anyway): when the command names
``--save_checkpoint_path``, the launcher gives every rank the name of a stop file there
(``TF_DLRM_STOP_FILE``) and writes it when signalled; every rank looks for it at most once a second and
then stops as if signalled (tf_dlrm/train/interrupt.py). The file is removed when the job ends.

If the launcher itself dies (SIGKILL, an out-of-memory kill), horovodrun gets SIGTERM from the kernel
(Linux's parent-death signal) and ends the ranks: a job never trains on unattended beside the one a restart
starts on the same checkpoints.

Exit status: ``128 + signal`` after a signal, else horovodrun's.
"""

from __future__ import annotations

if __name__ == "__main__":  # before the imports below: a stop signal while they run counts (tf_dlrm/io/early_stop.py)
    from tf_dlrm.io.early_stop import stop_while_starting

    stop_while_starting("tf_dlrm launch", "{tool}: stopped by {signal} while starting; no job was started")

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys

from tf_dlrm.io import files
from tf_dlrm.train.interrupt import LAUNCHER_ENV, STOP_FILE_ENV

SHELLS = {"sh", "bash", "dash", "zsh", "env"}
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _ends_with(launcher: int):
    """The ``preexec_fn`` of horovodrun's process: SIGTERM to it when the launcher (pid ``launcher``) dies."""

    def arrange() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != launcher:  # died before the line above: nobody would send the signal
            os.kill(os.getpid(), signal.SIGTERM)

    return arrange


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


def _rank_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            variables = handle.read().split(b"\0")
    except OSError:
        return None
    for variable in variables:
        if variable.startswith(b"HOROVOD_RANK="):
            return variable.split(b"=", 1)[1].decode()
    return None


def _is_shell(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            first = handle.read().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return True
    return os.path.basename(first) in SHELLS


def rank_processes(root: int) -> dict[str, int]:
    """``{rank: pid}`` of the ranks under process ``root`` on this host: for each ``HOROVOD_RANK``, the
    topmost process holding it that is not a shell (horovodrun runs each rank through ``sh -c``)."""
    ranks: dict[str, int] = {}
    pending = [root]
    while pending:
        pid = pending.pop(0)  # breadth first: a rank's process is found before its children
        rank = _rank_of(pid) if pid != root else None
        if rank is not None and rank not in ranks and not _is_shell(pid):
            ranks[rank] = pid
            continue
        pending.extend(_children(pid))
    return ranks


def stop_file_of(argv: list[str]) -> str | None:
    """The stop file for the job ``argv`` runs: in its ``--save_checkpoint_path`` (the last one given on the
    command line; None without one), named after this launcher so that no other job's file is taken for it."""
    directory = None
    for index, argument in enumerate(argv):
        if argument.startswith("--save_checkpoint_path="):
            directory = argument.split("=", 1)[1]
        elif argument == "--save_checkpoint_path" and index + 1 < len(argv):
            directory = argv[index + 1]
    if not directory:
        return None
    return files.join(files.absolute(directory), f".stop-{socket.gethostname()}-{os.getpid()}")


def write_stop_file(path: str) -> bool:
    try:
        files.makedirs(files.dirname(path))
        with files.open_file(path, "w") as handle:
            handle.write("stop\n")
        return True
    except OSError as error:
        print(f"tf_dlrm launch: could not write the stop file {path}: {error}", file=sys.stderr, flush=True)
        return False


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    horovodrun = os.environ.get("HOROVODRUN") or shutil.which("horovodrun") or \
        os.path.join(os.path.dirname(sys.executable), "horovodrun")
    stop_file = stop_file_of(argv)
    environment = {**os.environ, LAUNCHER_ENV: "1", **({STOP_FILE_ENV: stop_file} if stop_file else {})}
    received: list[int] = []
    job = None

    def on_signal(number, frame):
        del frame
        received.append(number)
        if job is None:  # horovodrun is starting (it gets SIGTERM when this process ends: the parent-death signal)
            print(f"tf_dlrm launch: stopped by {signal.Signals(number).name} while starting the job", file=sys.stderr,
                  flush=True)
            os._exit(128 + number)
        if len(received) == 1:
            ranks = rank_processes(job.pid)
            written = stop_file is not None and write_stop_file(stop_file)
            print(f"tf_dlrm launch: {signal.Signals(number).name}: SIGTERM to the ranks on this host "
                  f"({', '.join(f'rank {r} pid {p}' for r, p in sorted(ranks.items())) or 'none on this host'})"
                  f"{f', stop file {stop_file} for the others' if written else ''}; "
                  "they save and stop (a second signal stops horovodrun at once)", file=sys.stderr, flush=True)
            for pid in ranks.values():
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            if not ranks and not written:  # none started yet, or all on other hosts: only horovodrun can stop them
                job.send_signal(signal.SIGTERM)
        else:
            job.send_signal(signal.SIGTERM)

    for number in (signal.SIGINT, signal.SIGTERM):  # before horovodrun starts: no signal passes unanswered
        signal.signal(number, on_signal)
    job = subprocess.Popen([horovodrun, *argv], env=environment, start_new_session=True, preexec_fn=_ends_with(os.getpid()))
    try:
        code = job.wait()
    finally:
        if stop_file is not None and files.exists(stop_file):
            files.remove(stop_file)
    return 128 + received[0] if received else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
