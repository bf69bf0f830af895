"""Compiles tf_dlrm's CPU kernels against the installed TensorFlow.

    python -m tf_dlrm.ops.build [--force]

Writes ``tf_dlrm/ops/_tf_dlrm_ops.so`` (through a temporary file and one rename, so a failed
build leaves the previous library intact) and a stamp beside it: the hash of the sources, the
TensorFlow version and the compiler flags. When the stamp matches, nothing is rebuilt. AVX2/FMA
code is generated when the building machine has them (the library is built where it runs:
by ``scripts/install.sh``, or in the Docker image's last layer).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
LIBRARY = os.path.join(HERE, "_tf_dlrm_ops.so")
STAMP = LIBRARY + ".stamp"


def sources() -> list[str]:
    return sorted(glob.glob(os.path.join(HERE, "*.cc")))


def isa_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as handle:
            flags = set(handle.read().split())
    except OSError:
        return []
    return ["-mavx2", "-mfma"] if {"avx2", "fma"} <= flags else []


def tensorflow_version() -> str:
    for distribution in ("tensorflow-cpu", "tensorflow"):
        try:
            return f"{distribution}=={importlib.metadata.version(distribution)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    raise SystemExit("tf_dlrm.ops.build: TensorFlow is not installed in this environment")


def headers() -> list[str]:
    return sorted(glob.glob(os.path.join(HERE, "*.h")))


def build_key(flags: list[str]) -> str:
    digest = hashlib.sha256()
    for path in sources() + headers():
        with open(path, "rb") as handle:
            digest.update(handle.read())
    digest.update(" ".join([tensorflow_version(), *flags]).encode())
    return digest.hexdigest()


def up_to_date(key: str) -> bool:
    if not os.path.exists(LIBRARY) or not os.path.exists(STAMP):
        return False
    with open(STAMP) as handle:
        return handle.read().strip() == key


def compile_library(flags: list[str]) -> None:
    import tensorflow as tf

    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise SystemExit("tf_dlrm.ops.build: no C++ compiler found (install g++ or set CXX)")
    partial = LIBRARY + ".partial"
    command = [compiler, "-shared", "-fPIC", "-O3", *flags, *tf.sysconfig.get_compile_flags(),
               *sources(), "-o", partial, *tf.sysconfig.get_link_flags()]
    completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode != 0:
        if os.path.exists(partial):
            os.remove(partial)
        raise SystemExit(f"tf_dlrm.ops.build: compiling failed (exit {completed.returncode}):\n"
                         f"{' '.join(command)}\n{completed.stderr[-4000:]}")
    os.replace(partial, LIBRARY)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="rebuild even when the stamp matches")
    args = parser.parse_args(argv)
    flags = isa_flags()
    key = build_key(flags)
    if not args.force and up_to_date(key):
        print(f"[tf_dlrm.ops.build] {LIBRARY} is up to date", file=sys.stderr)
        return 0
    compile_library(flags)
    with open(STAMP + ".partial", "w") as handle:
        handle.write(key + "\n")
    os.replace(STAMP + ".partial", STAMP)
    print(f"[tf_dlrm.ops.build] built {LIBRARY}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
