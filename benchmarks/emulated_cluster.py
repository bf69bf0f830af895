r"""An emulated cluster on one machine: N network namespaces, one Horovod rank in each, joined by
shaped links.

    python benchmarks/emulated_cluster.py --ranks=4 --bandwidth_mbit=1000 [--latency_us=0] -- python main.py ...
    python benchmarks/emulated_cluster.py --ranks=4 --bandwidth_mbit=1000 --breakdown [--config=criteo_capped]
        [--batch_size=4096] [--steps=3]
    python benchmarks/emulated_cluster.py --cleanup

Needs root, ``ip`` and ``tc`` (iproute2). The topology, all of it inside namespaces of its own
(named ``--prefix`` + a suffix, nothing added to the machine's own namespace):

- a switch namespace ``<prefix>sw`` holding a bridge, with no address and no route;
- rank r's namespace ``<prefix>r`` holding ``eth0`` (10.239.0.(r+1)/24, no default route: no packet
  can leave the machine) and ``lo``, joined to the bridge by a veth pair;
- each veth end's egress shaped by ``tbf`` to ``--bandwidth_mbit``, so every rank has a full-duplex
  NIC of that rate on a non-blocking switch; with ``--latency_us``, a ``netem`` delay of half of it
  on either side (one way rank to rank), where the kernel has ``sch_netem``.

The ranks start directly in their namespaces (``ip netns exec``) with the environment horovodrun's
Gloo launcher gives them (``horovod/runner/gloo_run.py``: ``HOROVOD_RANK``/``SIZE``/``LOCAL_*``/
``CROSS_*``/``HOSTNAME``, ``HOROVOD_GLOO_RENDEZVOUS_ADDR``/``PORT``, ``HOROVOD_CONTROLLER=gloo``,
``HOROVOD_CPU_OPERATIONS=gloo``, ``HOROVOD_GLOO_IFACE``), and Horovod's own rendezvous server runs
in rank 0's namespace, so the ranks meet over the shaped links alone. Each namespace is one host
with one slot.

Everything is removed afterwards (the namespaces, and with them their links and qdiscs), also on
SIGINT/SIGTERM; ``--cleanup`` removes what an earlier run killed by SIGKILL left, by the prefix.

With ``--breakdown``, the ranks run ``benchmarks/step_breakdown_worker.py`` on a synthetic dataset
of ``--config``'s shape and one JSON line per rank is printed (``step_breakdown.py``'s record), with
``compute_ms`` (input + lookup + dense forward/backward + update) and ``communication_ms`` (exchange
+ allreduce) beside the phases. The machine's cores are shared by all ranks: beyond as many ranks as
cores, compute is oversubscribed and its figures are those of the shared cores, not of N machines.
Each rank runs on its own share of the machine's cores (one core for several ranks beyond as many ranks
as cores; ``--no-pin`` lets them float), so it takes as many threads as it has cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
REPOSITORY = os.path.dirname(BENCHMARKS)
DEFAULT_PREFIX = "tfdlrm"
MIN_RANKS, MAX_RANKS = 2, 8
SUBNET = "10.239.0"
INTERFACE = "eth0"
# ``ip netns exec NAME`` bind-mounts the files of /etc/netns/NAME/ over /etc/ (iproute2's per-namespace /etc).
NETNS_ETC = "/etc/netns"
COMPUTE = ("input", "lookup", "dense_forward_backward", "update")
COMMUNICATION = ("exchange", "allreduce")


class ClusterError(RuntimeError):
    """A condition that stops the cluster from being made or used, worded for the user."""


def _run(command: list[str]) -> str:
    completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode != 0:
        raise ClusterError(f"{' '.join(command)} failed: {(completed.stderr or completed.stdout).strip()}")
    return completed.stdout


def check_machine() -> None:
    """Raises ClusterError with one line when this machine cannot make namespaces and shaped links."""
    if os.geteuid() != 0:
        raise ClusterError("the emulated cluster needs root (network namespaces and tc); run it as root")
    for program in ("ip", "tc"):
        if shutil.which(program) is None:
            raise ClusterError(f"no '{program}' program here: install iproute2 (apt-get install iproute2)")


def namespaces(prefix: str) -> list[str]:
    """The namespaces whose name starts with ``prefix`` (``ip netns list`` prints 'name (id: n)')."""
    return [line.split()[0] for line in _run(["ip", "netns", "list"]).splitlines()
            if line.split() and line.split()[0].startswith(prefix)]


def _kill_inside(namespace: str) -> None:
    # A rank left running would keep its namespace's sockets; ids come from the kernel, not from a name match.
    completed = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
    for pid in completed.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def cleanup(prefix: str) -> list[str]:
    """Kills what runs in the namespaces named ``prefix``*, deletes them (their veths and qdiscs go with
    them) and returns their names."""
    found = namespaces(prefix)
    for namespace in found:
        _kill_inside(namespace)
    for namespace in found:
        subprocess.run(["ip", "netns", "delete", namespace], capture_output=True)
    if os.path.isdir(NETNS_ETC):
        for name in os.listdir(NETNS_ETC):
            if name.startswith(prefix):
                shutil.rmtree(os.path.join(NETNS_ETC, name), ignore_errors=True)
        if not os.listdir(NETNS_ETC):
            os.rmdir(NETNS_ETC)
    left = namespaces(prefix)
    if left:
        raise ClusterError(f"could not delete the namespaces {left}")
    return found


def tbf_arguments(bandwidth_mbit: float) -> list[str]:
    """``tbf`` at ``bandwidth_mbit``; its bucket holds at least a 64 KiB GSO segment (veths pass them
    whole, and a packet larger than the bucket would be dropped) or 1 ms of the rate."""
    rate_bytes = bandwidth_mbit * 1e6 / 8
    burst = max(2 * 65536, int(rate_bytes / 1000))
    return ["tbf", "rate", f"{bandwidth_mbit}mbit", "burst", str(burst), "latency", "200ms"]


def shape(namespace: str, device: str, bandwidth_mbit: float, delay_us: float) -> None:
    """Replaces ``device``'s egress qdisc in ``namespace``: ``netem`` delay (when ``delay_us``) with ``tbf`` under it."""
    subprocess.run(["tc", "-n", namespace, "qdisc", "del", "dev", device, "root"], capture_output=True)
    if delay_us > 0:
        try:
            _run(["tc", "-n", namespace, "qdisc", "add", "dev", device, "root", "handle", "1:", "netem", "delay",
                  f"{delay_us}us", "limit", "100000"])
        except ClusterError as error:
            raise ClusterError(f"this kernel has no netem qdisc (sch_netem) for --latency_us: run with --latency_us=0 "
                               f"({error})") from error
        _run(["tc", "-n", namespace, "qdisc", "add", "dev", device, "parent", "1:1", "handle", "10:",
              *tbf_arguments(bandwidth_mbit)])
    else:
        _run(["tc", "-n", namespace, "qdisc", "add", "dev", device, "root", "handle", "1:", *tbf_arguments(bandwidth_mbit)])


def host_cores(ranks: int, cores: list[int]) -> list[list[int]]:
    """The machine's cores each of ``ranks`` hosts runs on: an even share of ``cores`` when there are at least as
    many cores as hosts, else one core for hosts r, r + len(cores), ...

    Where the ranks divide evenly among the cores every host has the same compute, as equal machines would; either
    way a rank's default thread count (its cores, as ``os.sched_getaffinity`` tells it) matches the cores it has.
    """
    if not cores:
        raise ClusterError("no cores to pin the ranks to")
    if ranks <= len(cores):
        share = len(cores) // ranks
        return [cores[rank * share:(rank + 1) * share] for rank in range(ranks)]
    return [[cores[rank % len(cores)]] for rank in range(ranks)]


def machine_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


class EmulatedCluster:
    """Context manager: the namespaces, bridge and shaped links of ``ranks`` hosts; removed on exit.

    Args:
        ranks: hosts (one rank each), ``MIN_RANKS``..``MAX_RANKS``.
        bandwidth_mbit: every host's link rate each way, in Mbit/s.
        latency_us: one-way latency added between two hosts (0: the veths' own).
        prefix: the namespaces' name prefix (``--cleanup`` removes by it).
        pin: run each host's rank on its own share of the machine's cores (:func:`host_cores`); False lets the
            ranks float over all of them.
    """

    def __init__(self, ranks: int, bandwidth_mbit: float, latency_us: float = 0.0, prefix: str = DEFAULT_PREFIX,
                 pin: bool = True):
        if not MIN_RANKS <= ranks <= MAX_RANKS:
            raise ClusterError(f"Expected {MIN_RANKS} <= ranks <= {MAX_RANKS}. Received: ranks={ranks}")
        if bandwidth_mbit <= 0 or latency_us < 0:
            raise ClusterError(f"Expected bandwidth_mbit > 0 and latency_us >= 0. Received: "
                               f"bandwidth_mbit={bandwidth_mbit}, latency_us={latency_us}")
        if not prefix.isalnum() or len(prefix) > 8:
            raise ClusterError(f"Expected an alphanumeric prefix of at most 8 characters. Received: prefix={prefix!r}")
        self.ranks, self.bandwidth_mbit, self.latency_us, self.prefix = ranks, bandwidth_mbit, latency_us, prefix
        self.switch = f"{prefix}sw"
        self.hosts = [f"{prefix}{rank}" for rank in range(ranks)]
        self.addresses = [f"{SUBNET}.{rank + 1}" for rank in range(ranks)]
        self.cores = host_cores(ranks, machine_cores()) if pin else [machine_cores()] * ranks

    def __enter__(self) -> "EmulatedCluster":
        check_machine()
        if namespaces(self.prefix):
            raise ClusterError(f"namespaces named {self.prefix}* exist already ({', '.join(namespaces(self.prefix))}): "
                               f"another cluster runs, or remove them with --cleanup --prefix={self.prefix}")
        try:
            self._create()
        except BaseException:
            cleanup(self.prefix)
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        cleanup(self.prefix)

    def _create(self) -> None:
        _run(["ip", "netns", "add", self.switch])
        _run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
        for rank, (host, address) in enumerate(zip(self.hosts, self.addresses)):
            _run(["ip", "netns", "add", host])
            # Both veth ends are made inside the namespaces: the machine's own namespace never holds one.
            _run(["ip", "-n", self.switch, "link", "add", f"port{rank}", "type", "veth", "peer", "name", INTERFACE,
                  "netns", host])
            _run(["ip", "-n", self.switch, "link", "set", f"port{rank}", "master", "br0", "up"])
            _run(["ip", "-n", host, "address", "add", f"{address}/24", "dev", INTERFACE])
            _run(["ip", "-n", host, "link", "set", INTERFACE, "up"])
            _run(["ip", "-n", host, "link", "set", "lo", "up"])
            # Horovod 0.28.1 opens its process-set Gloo contexts (gloo_context.cc, InitializeForProcessSet)
            # without HOROVOD_GLOO_IFACE, on the address the machine's hostname resolves to: in each
            # namespace, that hostname must name the namespace's own address, as on a real host.
            os.makedirs(os.path.join(NETNS_ETC, host), exist_ok=True)
            with open(os.path.join(NETNS_ETC, host, "hosts"), "w") as hosts:
                hosts.write(f"127.0.0.1 localhost\n{address} {socket.gethostname()}\n")
        self.reshape(self.bandwidth_mbit, self.latency_us)

    def reshape(self, bandwidth_mbit: float, latency_us: float | None = None) -> None:
        """Sets every link to ``bandwidth_mbit`` (and ``latency_us``), both directions; a running job keeps
        its connections."""
        latency_us = self.latency_us if latency_us is None else latency_us
        for rank, host in enumerate(self.hosts):
            shape(host, INTERFACE, bandwidth_mbit, latency_us / 2)
            shape(self.switch, f"port{rank}", bandwidth_mbit, latency_us / 2)
        self.bandwidth_mbit, self.latency_us = bandwidth_mbit, latency_us

    def qdiscs(self) -> str:
        return "".join(_run(["tc", "-n", host, "qdisc", "show", "dev", INTERFACE]) for host in self.hosts)

    def _start_rendezvous(self, work_dir: str) -> tuple[subprocess.Popen, int]:
        port_file = os.path.join(work_dir, "rendezvous_port")
        server = subprocess.Popen(["ip", "netns", "exec", self.hosts[0], sys.executable, os.path.abspath(__file__),
                                   "--serve_rendezvous", f"--ranks={self.ranks}", f"--prefix={self.prefix}",
                                   f"--port_file={port_file}"],
                                  stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + 60
        while not os.path.exists(port_file):
            if server.poll() is not None or time.time() > deadline:
                _stop(server)
                raise ClusterError(f"the rendezvous server in {self.hosts[0]} did not start (exit {server.returncode})")
            time.sleep(0.1)
        return server, int(open(port_file).read())

    def rank_environment(self, rank: int, port: int, base: dict | None = None) -> dict:
        """horovodrun's Gloo environment of ``rank``: its own host of one slot, the rendezvous in rank 0's namespace."""
        env = dict(os.environ if base is None else base)
        env.update({
            "HOROVOD_HOSTNAME": self.hosts[rank], "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(self.ranks),
            "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "1", "HOROVOD_CROSS_RANK": str(rank),
            "HOROVOD_CROSS_SIZE": str(self.ranks), "HOROVOD_GLOO_RENDEZVOUS_ADDR": self.addresses[0],
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port), "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_IFACE": INTERFACE, "PYTHONUNBUFFERED": "1",
        })
        return env

    def run(self, command: list[str], env: dict | None = None, cwd: str = REPOSITORY, timeout: float = 900) -> list[tuple[int, str]]:
        """Runs ``command`` as every rank in its namespace; returns each rank's (exit code, output). When
        one rank fails the others are stopped (as horovodrun does)."""
        work_dir = tempfile.mkdtemp(prefix="tf_dlrm_cluster.")
        server = None
        processes = []
        try:
            server, port = self._start_rendezvous(work_dir)
            logs = [open(os.path.join(work_dir, f"rank{rank}.log"), "w+") for rank in range(self.ranks)]
            for rank, host in enumerate(self.hosts):
                processes.append(subprocess.Popen(["ip", "netns", "exec", host, *command], cwd=cwd,
                                                  env=self.rank_environment(rank, port, env), stdin=subprocess.DEVNULL,
                                                  stdout=logs[rank], stderr=subprocess.STDOUT, start_new_session=True,
                                                  preexec_fn=_pinning(self.cores[rank])))
            deadline, timed_out = time.time() + timeout, False
            while any(p.poll() is None for p in processes):
                if any(p.returncode not in (None, 0) for p in processes):
                    break
                if time.time() > deadline:
                    timed_out = True
                    break
                time.sleep(0.2)
            for process in processes:
                _stop(process)
            results = []
            for rank, log in enumerate(logs):
                log.seek(0)
                results.append((processes[rank].returncode, log.read()))
                log.close()
            if timed_out:
                raise ClusterError(f"the ranks did not end in {timeout:.0f} s; rank 0's output:\n{results[0][1][-3000:]}")
            return results
        finally:
            for process in processes:
                _stop(process)
            if server is not None:
                _stop(server)
            shutil.rmtree(work_dir, ignore_errors=True)


def _pinning(cores: list[int]):
    """A ``preexec_fn`` that binds the child (and all it starts: ``ip netns exec`` execs the rank) to ``cores``."""
    return lambda: os.sched_setaffinity(0, cores)


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM to the process group made for ``process``, SIGKILL after 10 s."""
    if process.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def serve_rendezvous(ranks: int, prefix: str, port_file: str) -> None:
    """Horovod's rendezvous server for ``ranks`` hosts of one slot (as ``gloo_run.launch_gloo`` starts it);
    writes its port to ``port_file`` and serves until terminated."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousServer

    server = RendezvousServer()
    port = server.start()
    server.init(get_host_assignments(parse_hosts(",".join(f"{prefix}{rank}:1" for rank in range(ranks))), ranks))
    with open(port_file + ".partial", "w") as handle:
        handle.write(str(port))
    os.replace(port_file + ".partial", port_file)
    signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)  # sigwait takes them only while blocked
    signal.sigwait(signals)
    server.stop()


def split_record(record: dict) -> dict:
    """A step_breakdown record with its compute and communication milliseconds."""
    ms = record["ms"]
    return {**record, "compute_ms": round(sum(ms[name] for name in COMPUTE), 2),
            "communication_ms": round(sum(ms[name] for name in COMMUNICATION), 2)}


def breakdown(cluster: EmulatedCluster, args) -> list[dict]:
    """step_breakdown_worker.py on every rank of ``cluster``; one summarised record per rank."""
    import dataclasses

    sys.path.insert(0, BENCHMARKS)
    from step_breakdown import summarize
    from train_throughput import CONFIGS, make_dataset

    config = CONFIGS[args.config]
    batch = args.batch_size or config.batch_size
    with tempfile.TemporaryDirectory(prefix="tf_dlrm_cluster_breakdown.") as directory:
        spec = make_dataset(dataclasses.replace(config, batch_size=batch), os.path.join(directory, "data"), batch * 2, 1)
        out_dir = os.path.join(directory, "out")
        os.mkdir(out_dir)
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPOSITORY + os.pathsep + os.environ.get("PYTHONPATH", ""))
        results = cluster.run([sys.executable, os.path.join(BENCHMARKS, "step_breakdown_worker.py"), spec.source, out_dir,
                               args.config, f"--batch_size={batch}", f"--steps={args.steps}"], env=env, timeout=args.timeout)
        for rank, (code, output) in enumerate(results):
            if code != 0:
                raise ClusterError(f"rank {rank} exited with {code}:\n{output[-3000:]}")
        summary_args = argparse.Namespace(config=args.config, world_size=cluster.ranks)
        records = []
        for rank in range(cluster.ranks):
            with open(os.path.join(out_dir, f"rank{rank}.json")) as handle:
                record = summarize(json.load(handle), "horovod", summary_args, {})
            records.append({**split_record(record), "bandwidth_mbit": cluster.bandwidth_mbit,
                            "latency_us": cluster.latency_us, "emulated_cluster": True, "cores": cluster.cores[rank]})
        return records


def _raise_interrupt(signum, frame):
    # SIGTERM takes the same path as Ctrl-C, so the finally clauses remove the namespaces.
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2, help=f"hosts, one rank each ({MIN_RANKS}..{MAX_RANKS})")
    parser.add_argument("--bandwidth_mbit", type=float, default=1000.0, help="every link's rate each way")
    parser.add_argument("--latency_us", type=float, default=0.0, help="one-way latency between hosts (needs sch_netem)")
    parser.add_argument("--prefix", default=DEFAULT_PREFIX, help="the namespaces' name prefix")
    parser.add_argument("--cleanup", action="store_true", help="remove the namespaces named PREFIX* and exit")
    parser.add_argument("--breakdown", action="store_true", help="run step_breakdown_worker.py on the ranks")
    parser.add_argument("--config", default="criteo_capped")
    parser.add_argument("--batch_size", type=int, default=0, help="global batch (0: the config's)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                        help="each rank on its share of the machine's cores (--no-pin: all ranks on all cores)")
    parser.add_argument("--serve_rendezvous", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port_file", help=argparse.SUPPRESS)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND run as every rank")
    args = parser.parse_args(argv)
    if args.serve_rendezvous:
        serve_rendezvous(args.ranks, args.prefix, args.port_file)
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        check_machine()
        if args.cleanup:
            removed = cleanup(args.prefix)
            print(f"removed {len(removed)} namespaces named {args.prefix}*: {' '.join(removed) or '-'}")
            return 0
        if not args.breakdown and not command:
            raise ClusterError("nothing to run: give -- COMMAND, --breakdown or --cleanup")
        if args.breakdown:
            sys.path.insert(0, BENCHMARKS)
            from train_throughput import CONFIGS

            if args.config not in CONFIGS:
                raise ClusterError(f"Expected --config in {sorted(CONFIGS)}. Received: --config={args.config}")
            batch = args.batch_size or CONFIGS[args.config].batch_size
            if batch % args.ranks:
                raise ClusterError(f"--batch_size={batch} does not divide by --ranks={args.ranks}")
        signal.signal(signal.SIGTERM, _raise_interrupt)
        with EmulatedCluster(args.ranks, args.bandwidth_mbit, args.latency_us, args.prefix, args.pin) as cluster:
            print(f"emulated cluster: {cluster.ranks} hosts {', '.join(cluster.addresses)}, links "
                  f"{cluster.bandwidth_mbit:g} Mbit/s each way, latency +{cluster.latency_us:g} us, cores "
                  f"{' '.join(','.join(map(str, cores)) for cores in cluster.cores)}", file=sys.stderr)
            if args.breakdown:
                for record in breakdown(cluster, args):
                    print(json.dumps(record), flush=True)
                return 0
            results = cluster.run(command, timeout=args.timeout)
            for rank, (code, output) in enumerate(results):
                sys.stdout.write("".join(f"[{rank}] {line}\n" for line in output.splitlines()))
            # A rank ended by a signal reads as the shell writes it (128 + signal); a rank that failed by
            # itself (a positive code) is named before those the others' failure made this stop.
            codes = [code if code >= 0 else 128 - code for code, _ in results]
            if any(codes):
                print(f"emulated_cluster: the ranks exited with {codes}", file=sys.stderr)
            return next((code for code, _ in results if code > 0), max(codes))
    except ClusterError as error:
        print(f"emulated_cluster: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("emulated_cluster: interrupted; the namespaces were removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
