"""``horovodrun -H 127.0.0.2:1,127.0.0.3:1``: Horovod's several-machine path, taken for real on one machine.

horovodrun treats a host as remote when its address is none of this machine's interface addresses
(``horovod.runner.util.network.filter_local_addresses``). Linux routes all of 127.0.0.0/8 to the
loopback interface, but ``lo`` holds only 127.0.0.1 as an address, so 127.0.0.2 and 127.0.0.3 are
two "other machines" to horovodrun: it checks ssh to each, starts each rank through ``ssh HOST``
with its environment on the command line, and has Gloo talk over the interface named by
``--network-interface``. An sshd of this test's own plays both machines: a throwaway host key, one
authorized key, a free port, all in a temporary directory removed at the end (the user's ``~/.ssh``
is neither read nor written: an ``ssh`` first on ``PATH`` adds ``-F`` with a config of its own).

The two-host job trains tiny data under ``python -m tf_dlrm.cli.launch`` (the command
docs/training.md shows under *Several machines*), checkpointing to a directory both "hosts" see (the
same filesystem here, shared storage on real machines), and is preempted: SIGTERM to the launcher,
which has no rank on its host, reaches both ranks through its stop file there; they save the same
step and exit 143. horovodrun then resumes it on both hosts for 4 more steps, and it ends with the
AUC of one process trained to that step within 1e-6, and a checkpoint table for table within 1e-5
(the tolerances are argued below).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from conftest import HOROVODRUN, REPO, run_python, worker_env
from tf_dlrm.checkpoint import store as checkpoint_store

sys.path.insert(0, os.path.join(REPO, "tests", "bad_inputs"))
sys.path.insert(0, os.path.join(REPO, "tests", "checkpoint"))
from checkpoint_runs import max_difference  # noqa: E402
from test_signals import EXIT_RECORDER, LINE, check_checkpoint_of_line, run_until_training_then_signal  # noqa: E402
from tiny_dataset import TINY_MODEL, write_tiny  # noqa: E402

pytestmark = pytest.mark.multirank
HOSTS = ("127.0.0.2", "127.0.0.3")
# Epochs of 8 steps (2048 samples, batch 256), as many as it takes until the signal, a checkpoint each epoch.
FLAGS = [*TINY_MODEL, "--epochs=100000", "--checkpoint_every_steps=8", "--evals_per_epoch=0"]


def _find(program: str, *fallbacks: str) -> str | None:
    for candidate in (shutil.which(program), *fallbacks):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _free_port(address: str) -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        return probe.getsockname()[1]


def _listening(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1):
            return True
    except OSError:
        return False


def _stop_tree(process: subprocess.Popen) -> None:
    """SIGTERM to ``process`` and everything under it (an sshd's sessions run the ranks), then SIGKILL."""
    try:
        tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for member in reversed(tree):
        try:
            member.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(tree, timeout=10)
    for member in alive:
        try:
            member.kill()
        except psutil.NoSuchProcess:
            pass
    process.wait(timeout=10)


@pytest.fixture
def loopback_hosts():
    """An sshd on 127.0.0.2 and 127.0.0.3 at a free port; yields what horovodrun needs to reach it."""
    sshd, ssh, keygen = _find("sshd", "/usr/sbin/sshd"), _find("ssh"), _find("ssh-keygen")
    if not (sshd and ssh and keygen):
        pytest.skip("no OpenSSH server or client here: scripts/install.sh installs openssh-server as root "
                    "with apt-get (or: apt-get install openssh-server)")
    if os.geteuid() == 0 and not os.path.isdir("/run/sshd"):
        os.makedirs("/run/sshd", mode=0o755)  # sshd's privilege-separation directory, which its service unit would make
    home = tempfile.mkdtemp(prefix="tf_dlrm_two_hosts.")
    server = None
    try:
        for name in ("host_key", "client_key"):
            subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(home, name)], check=True)
        shutil.copy(os.path.join(home, "client_key.pub"), os.path.join(home, "authorized_keys"))
        port = _free_port(HOSTS[0])
        with open(os.path.join(home, "sshd_config"), "w") as config:
            config.write("\n".join([
                f"Port {port}", *(f"ListenAddress {host}" for host in HOSTS),
                f"HostKey {home}/host_key", f"AuthorizedKeysFile {home}/authorized_keys", f"PidFile {home}/sshd.pid",
                # The temporary directory is not under a home directory whose modes sshd would check.
                "StrictModes no", "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
                "PermitRootLogin prohibit-password", "LogLevel VERBOSE", "",
            ]))
        host_key = open(os.path.join(home, "host_key.pub")).read().split()[:2]
        with open(os.path.join(home, "known_hosts"), "w") as known:
            known.writelines(f"[{host}]:{port} {' '.join(host_key)}\n" for host in HOSTS)
        with open(os.path.join(home, "ssh_config"), "w") as config:
            config.write("\n".join([
                "Host *", f"  UserKnownHostsFile {home}/known_hosts", "  GlobalKnownHostsFile /dev/null",
                "  BatchMode yes", "  LogLevel ERROR", "",
            ]))
        bin_dir = os.path.join(home, "bin")
        os.mkdir(bin_dir)
        with open(os.path.join(bin_dir, "ssh"), "w") as wrapper:
            wrapper.write(f'#!/bin/sh\nexec {ssh} -F {home}/ssh_config "$@"\n')
        os.chmod(os.path.join(bin_dir, "ssh"), 0o755)
        server = subprocess.Popen([sshd, "-D", "-f", os.path.join(home, "sshd_config"), "-E", os.path.join(home, "sshd.log")],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        while not all(_listening(host, port) for host in HOSTS) and server.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        if not all(_listening(host, port) for host in HOSTS):
            log = open(os.path.join(home, "sshd.log")).read().strip().splitlines() if os.path.exists(os.path.join(home, "sshd.log")) else []
            pytest.skip(f"sshd did not listen on {' and '.join(HOSTS)} port {port}: {log[-1] if log else 'no log'}")
        login = subprocess.run([os.path.join(bin_dir, "ssh"), "-p", str(port), "-i", os.path.join(home, "client_key"), HOSTS[0], "true"],
                               capture_output=True, text=True, timeout=30)
        if login.returncode != 0:
            pytest.skip(f"ssh to the test's own sshd was refused: {login.stderr.strip().splitlines()[-1:] or login.returncode}")
        yield {"home": home, "port": port, "identity": os.path.join(home, "client_key"), "bin": bin_dir,
               "sshd_log": os.path.join(home, "sshd.log")}
    finally:
        if server is not None:
            _stop_tree(server)
        shutil.rmtree(home, ignore_errors=True)


def events(path) -> list[dict]:
    return [json.loads(line) for line in open(path, encoding="utf-8").read().splitlines()]


def test_two_hosts_through_ssh_preempted_resumed_and_equal_one_process(loopback_hosts):
    """Launched by ``python -m tf_dlrm.cli.launch`` and SIGTERMed while training: no rank runs on the
    launcher's host, so its signal reaches them only through the stop file in the shared checkpoint
    directory; both ranks save the same step and exit 143. Then resumed by horovodrun on both hosts,
    and compared with one process trained to the same step."""
    home = loopback_hosts["home"]
    data = write_tiny(os.path.join(home, "data"))
    shared = os.path.join(home, "shared")  # the checkpoint directory: on shared storage across real machines
    save, log, codes = os.path.join(shared, "checkpoints"), os.path.join(shared, "log.jsonl"), os.path.join(home, "codes")
    os.mkdir(codes)
    hosts = ["-np", "2", "-H", ",".join(f"{host}:1" for host in HOSTS), "--gloo", "--network-interface", "lo",
             "--ssh-port", str(loopback_hosts["port"]), "--ssh-identity-file", loopback_hosts["identity"],
             "--disable-cache", "--verbose"]
    path = {"PATH": loopback_hosts["bin"] + os.pathsep + os.environ.get("PATH", "")}
    code, output = run_until_training_then_signal(
        [sys.executable, "-m", "tf_dlrm.cli.launch", *hosts, sys.executable, EXIT_RECORDER, codes, sys.executable,
         "main.py", f"--dataset_path={data}", *FLAGS, f"--save_checkpoint_path={save}", f"--log_path={log}"],
        signal.SIGTERM, env=path)
    assert code == 143, output[-6000:]
    assert re.search(r"SIGTERM to the ranks on this host \(none on this host\), stop file \S+/\.stop-\S+ for the others",
                     output), output[-6000:]
    recorded = {name: open(os.path.join(codes, name)).read().strip() for name in os.listdir(codes)}
    # The ranks leave together after a last barrier, but horovodrun kills the ranks still running once one
    # has exited non-zero: a rank's wrapper may be killed in the milliseconds before it records its 143.
    # What matters is checked below: the checkpoint of the stopped step holds both ranks' slices.
    assert recorded and set(recorded.values()) == {"143"}, (recorded, output[-6000:])
    assert len(recorded) == 2 or "Terminating remaining workers after failure of Process" in output, output[-6000:]
    check_checkpoint_of_line(output, save)
    stopped = int(LINE.findall(output)[0][0])
    assert checkpoint_store.read_manifest(os.path.join(save, checkpoint_store.checkpoint_name(stopped)))[
        "saved_world_size"] == 2
    assert not [name for name in os.listdir(save) if name.startswith(".stop-")]  # the launcher removed its file

    # Horovod's remote path: ssh to each host checked, then rank r started through `ssh HOST_r`.
    # (Searched in the whole output: under load the ranks' lines may be interleaved with horovodrun's.)
    launched = {rank: host for host, rank in re.findall(
        r"ssh -o PasswordAuthentication=no -o StrictHostKeyChecking=no (\S+) .*?HOROVOD_RANK=(\d)", output)}
    assert launched == {"0": HOSTS[0], "1": HOSTS[1]}, output[-6000:]
    sessions = open(loopback_hosts["sshd_log"]).read()
    for host in HOSTS:
        assert f"on {host} port {loopback_hosts['port']}" in sessions, sessions[-3000:]
    assert "Accepted publickey" in sessions

    steps = stopped + 4
    command = [HOROVODRUN, *hosts, sys.executable, "main.py", f"--dataset_path={data}", *FLAGS, f"--max_steps={steps}",
               f"--save_checkpoint_path={save}", "--resume", f"--log_path={log}"]
    job = subprocess.Popen(command, cwd=REPO, env=worker_env(path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)
    try:
        output, _ = job.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)  # the ranks themselves run under sshd: the fixture stops them
        output, _ = job.communicate()
        pytest.fail(f"the two-host job did not end in 400 s:\n{output[-6000:]}")
    assert job.returncode == 0, output[-6000:]

    two = events(log)
    assert [e["step"] for e in two if e["event"] == "checkpoint_restored"] == [stopped]
    config = two[0]
    assert config["event"] == "config" and len(config["rank_embedding_bytes"]) == 2
    assert config["alltoall_bytes_per_step"] > 0  # the model-parallel table's lookups crossed the "hosts"
    final = two[-1]
    assert final["event"] == "final" and final["world_size"] == 2 and final["steps"] == steps
    # It learned: these tiny data rank above chance from the first steps (one process: AUC 0.560 after 4
    # steps, 0.567 after 12), while the log loss hovers about the positive rate's for the first dozens of
    # steps (NE 1.0002 after 12), so NE < 1 would depend on when the signal came.
    assert final["auc"] > 0.55, final
    newest = os.path.join(save, checkpoint_store.checkpoint_name(steps))
    manifest = checkpoint_store.read_manifest(newest)
    checkpoint_store.verify_files(newest, manifest)
    assert manifest["saved_world_size"] == 2

    reference_save, reference_log = os.path.join(home, "one", "checkpoints"), os.path.join(home, "one", "log.jsonl")
    run_python(["main.py", f"--dataset_path={data}", *FLAGS, f"--max_steps={steps}", f"--save_checkpoint_path={reference_save}",
                f"--log_path={reference_log}"], timeout=300)
    one = events(reference_log)[-1]
    assert one["world_size"] == 1 and one["steps"] == steps
    difference, where = max_difference(newest, os.path.join(reference_save, checkpoint_store.checkpoint_name(steps)))
    print(f"hosts {', '.join(f'rank {r} on {h}' for r, h in sorted(launched.items()))}; stopped by the launcher's stop "
          f"file at step {stopped} (both ranks 143), resumed to {steps}; AUC two hosts {final['auc']!r}, one process "
          f"{one['auc']!r}; NE two hosts {final['ne']!r}; largest checkpoint difference {difference:.3g} in {where}")
    # Two ranks sum each gradient in another order than one process: float32 roundoff of a few
    # ulps per step on weights of order 1, a few dozen steps: far below 1e-5.
    assert difference <= 1e-5, f"largest difference {difference} in {where}"
    # AUC is a rank statistic: it moves only when two scores swap order, by at least
    # 1/(positives * negatives) (about 1.6e-5 for 512 samples); scores equal to roundoff keep their order.
    assert abs(final["auc"] - one["auc"]) <= 1e-6, (final, one)
