"""``main.py`` in a memory cgroup of its own, for the big-table test.

    python tests/checkpoint/limited_main.py LIMIT_BYTES GROUP_PREFIX [main.py flags...]

Creates the memory cgroup ``GROUP_PREFIX<rank>`` (cgroup v2, or v1's memory hierarchy) limited to
LIMIT_BYTES of resident memory (page cache included, as the kernel charges it; no swap), moves this
process into it and replaces itself with ``python main.py FLAGS``: every rank horovodrun starts
runs under its own limit, and the kernel's OOM killer ends a rank that needs more.

Exits with 77 when cgroups cannot be written here (the test then says why it cannot run).
"""

import os
import sys

V2, V1 = "/sys/fs/cgroup", "/sys/fs/cgroup/memory"


def limit_this_process(limit: int, name: str) -> None:
    if os.path.isfile(os.path.join(V2, "cgroup.controllers")) and "memory" in open(os.path.join(V2, "cgroup.subtree_control")).read():
        group = os.path.join(V2, name)
        os.makedirs(group, exist_ok=True)
        settings = {"memory.max": str(limit), "memory.swap.max": "0"}
    else:
        group = os.path.join(V1, name)
        os.makedirs(group, exist_ok=True)
        settings = {"memory.limit_in_bytes": str(limit)}
    for key, value in settings.items():
        if os.path.exists(os.path.join(group, key)):
            with open(os.path.join(group, key), "w") as handle:
                handle.write(value)
    with open(os.path.join(group, "cgroup.procs"), "w") as handle:
        handle.write(str(os.getpid()))


if __name__ == "__main__":
    limit, prefix = int(sys.argv[1]), sys.argv[2]
    try:
        limit_this_process(limit, f"{prefix}{os.environ.get('HOROVOD_RANK', '0')}")
    except OSError as error:
        print(f"limited_main: cannot create a memory cgroup here: {error}", file=sys.stderr)
        sys.exit(77)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.execv(sys.executable, [sys.executable, os.path.join(repo, "main.py"), *sys.argv[3:]])
