"""The memory a process can still use: its memory cgroup's headroom and the host's available RAM.

Read from Linux's own files, before anything large is allocated:

- the host: ``MemAvailable`` of ``/proc/meminfo`` (what the kernel can give without swapping);
- the cgroup: for this process's memory cgroup and each of its ancestors, ``memory.max`` minus
  ``memory.current`` (cgroup v2) or ``memory.limit_in_bytes`` minus ``memory.usage_in_bytes`` (v1),
  plus the inactive file pages the kernel reclaims first; a container's or a scheduler's limit is one of these.

Ranks on one host share its RAM, and ranks in one cgroup share its limit: :func:`groups` puts the
ranks of a job together by host and by cgroup, so a check can compare each group's planned bytes with
what that group has (see :func:`tf_dlrm.sharding.memory_plan.check_limits`).
"""

from __future__ import annotations

import dataclasses
import os
import socket

UNLIMITED = 2**60  # cgroup v1 writes a huge number for "no limit"


@dataclasses.dataclass(frozen=True)
class MemoryLimit:
    """Bytes a process may still allocate, what says so (for the error message), and ``scope``: the
    host or cgroup it belongs to (ranks of one scope share the bytes)."""

    available: int
    source: str
    scope: str


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return None


def host_available(proc: str = "/proc") -> MemoryLimit | None:
    text = _read(os.path.join(proc, "meminfo"))
    for line in (text or "").splitlines():
        if line.startswith("MemAvailable:"):
            host = socket.gethostname()
            return MemoryLimit(int(line.split()[1]) * 1024, f"MemAvailable of host {host}", f"host {host}")
    return None


def cgroup_path(proc: str = "/proc") -> tuple[str, str] | None:
    """``(version, path)`` of this process's memory cgroup: ``("v2", "/a/b")`` or ``("v1", ...)``."""
    text = _read(os.path.join(proc, "self", "cgroup")) or ""
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return "v1", path
    for line in text.splitlines():
        if line.startswith("0::"):
            return "v2", line[3:]
    return None


def _inactive_file(directory: str, version: str) -> int:
    key = "inactive_file" if version == "v2" else "total_inactive_file"
    for line in (_read(os.path.join(directory, "memory.stat")) or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


def cgroup_headroom(proc: str = "/proc", root: str = "/sys/fs/cgroup") -> MemoryLimit | None:
    """The smallest ``limit - usage`` of this process's memory cgroup and its ancestors (None: no limit)."""
    found = cgroup_path(proc)
    if found is None:
        return None
    version, path = found
    base = root if version == "v2" else os.path.join(root, "memory")
    limit_file, usage_file = ("memory.max", "memory.current") if version == "v2" else \
        ("memory.limit_in_bytes", "memory.usage_in_bytes")
    parts = [p for p in path.split("/") if p]
    tightest = None
    for depth in range(len(parts), -1, -1):
        directory = os.path.join(base, *parts[:depth])
        limit, usage = _read(os.path.join(directory, limit_file)), _read(os.path.join(directory, usage_file))
        if limit is None or usage is None or limit == "max" or int(limit) >= UNLIMITED:
            continue
        # Inactive file pages count as usage but the kernel reclaims them first (as `docker stats` does).
        headroom = max(0, int(limit) - int(usage) + _inactive_file(directory, version))
        if tightest is None or headroom < tightest.available:
            group = "/" + "/".join(parts[:depth])
            tightest = MemoryLimit(headroom, f"the limit of memory cgroup {group} ({limit_file} {int(limit)} bytes)",
                                   f"cgroup {socket.gethostname()}:{group}")
    return tightest


def this_process() -> dict:
    """What :func:`groups` needs from one rank (JSON-serialisable, to gather over ranks)."""
    host, cgroup = host_available(), cgroup_headroom()
    return {"limits": [dataclasses.asdict(limit) for limit in (host, cgroup) if limit is not None]}


def groups(ranks: list[dict]) -> list[tuple[list[int], MemoryLimit]]:
    """``(ranks, limit)`` of every host (its available RAM) and every cgroup (its headroom) that the
    ranks (:func:`this_process` of each, in rank order) share; the smallest figure reported by a
    member stands for the group."""
    found: dict[str, tuple[list[int], MemoryLimit]] = {}
    for rank, facts in enumerate(ranks):
        for limit in (MemoryLimit(**entry) for entry in facts["limits"]):
            members, known = found.get(limit.scope, ([], limit))
            found[limit.scope] = (members + [rank], limit if limit.available < known.available else known)
    return list(found.values())
