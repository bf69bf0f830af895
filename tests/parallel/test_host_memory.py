"""The memory a rank can use, read from /proc and the cgroup filesystem as Linux lays them out (files
written here in the kernel's formats), and the plan check over ranks sharing a host or a cgroup."""

from __future__ import annotations

import os

import pytest

from tf_dlrm.parallel import host_memory
from tf_dlrm.parallel.host_memory import MemoryLimit
from tf_dlrm.sharding.memory_plan import RankMemory, check_limits


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text)


def test_mem_available_in_bytes(tmp_path):
    write(tmp_path / "proc" / "meminfo", "MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n")
    limit = host_memory.host_available(str(tmp_path / "proc"))
    assert limit.available == 20_000_000 * 1024 and limit.source.startswith("MemAvailable of host ")


def test_cgroup_v2_tightest_ancestor_with_inactive_file_pages(tmp_path):
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    write(proc / "self" / "cgroup", "0::/job/rank1\n")
    write(root / "job" / "memory.max", "3000000000\n")  # the job: 3.0e9, 2.5e9 in use -> 0.5e9 left
    write(root / "job" / "memory.current", "2500000000\n")
    write(root / "job" / "memory.stat", "anon 1\ninactive_file 100000000\n")  # + 0.1e9 reclaimable
    write(root / "job" / "rank1" / "memory.max", "max\n")  # the rank's own group has no limit
    write(root / "job" / "rank1" / "memory.current", "2000000000\n")
    write(root / "memory.max", "max\n")
    limit = host_memory.cgroup_headroom(str(proc), str(root))
    assert limit.available == 600_000_000
    assert "memory cgroup /job " in limit.source and limit.scope.endswith(":/job")


def test_cgroup_v1_memory_hierarchy_and_no_limit(tmp_path):
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    write(proc / "self" / "cgroup", "12:cpu,cpuacct:/x\n9:memory:/docker/abc\n0::/\n")
    write(root / "memory" / "docker" / "abc" / "memory.limit_in_bytes", "1073741824\n")
    write(root / "memory" / "docker" / "abc" / "memory.usage_in_bytes", "73741824\n")
    write(root / "memory" / "docker" / "abc" / "memory.stat", "cache 5\ntotal_inactive_file 0\n")
    write(root / "memory" / "memory.limit_in_bytes", str(2**63 - 4096))  # v1's "no limit"
    write(root / "memory" / "memory.usage_in_bytes", "5")
    assert host_memory.cgroup_headroom(str(proc), str(root)).available == 1_000_000_000
    write(root / "memory" / "docker" / "abc" / "memory.limit_in_bytes", str(2**63 - 4096))
    assert host_memory.cgroup_headroom(str(proc), str(root)) is None


def test_ranks_sharing_a_host_share_its_memory():
    host = {"available": 10, "source": "MemAvailable of host a", "scope": "host a"}
    ranks = [{"limits": [host, {"available": 7, "source": "cg0", "scope": "cgroup a:/r0"}]},
             {"limits": [{**host, "available": 9}, {"available": 8, "source": "cg1", "scope": "cgroup a:/r1"}]},
             {"limits": [{"available": 50, "source": "MemAvailable of host b", "scope": "host b"}]}]
    found = {limit.scope: (members, limit.available) for members, limit in host_memory.groups(ranks)}
    assert found == {"host a": ([0, 1], 9), "cgroup a:/r0": ([0], 7), "cgroup a:/r1": ([1], 8), "host b": ([2], 50)}
    memory = [RankMemory(0, 5, 0, 0, (("big", 5),)), RankMemory(1, 5, 0, 0, (("big", 5),)), RankMemory(2, 40, 0, 0)]
    # Each rank fits its own cgroup and host b fits, but ranks 0 and 1 together need 10 > 9 of host a.
    with pytest.raises(ValueError, match=r"ranks 0, 1 need 10 B .* more than the 9 B left by MemAvailable of host a\. "
                                         r"Largest tables on rank 0 \(with their optimizer state\): 'big' 5 B\. Use more ranks"):
        check_limits(memory, host_memory.groups(ranks))
    check_limits(memory[:1] + [RankMemory(1, 4, 0, 0)] + memory[2:], host_memory.groups(ranks))
    check_limits(memory, [([0], MemoryLimit(5, "s", "x"))])  # exactly what it has
