"""The CPU allocator of training runs (``tf_dlrm.cli.cpu_allocator``): TensorFlow's BFC pool by
default, chosen before the first tensor, so that a step's large tensors stop page-faulting in fresh
memory every step; an explicit ``TF_CPU_ALLOCATOR_USE_BFC`` wins."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO, worker_env
from tf_dlrm.cli import cpu_allocator

# Threads configured the trainer's way, then 40 steps that each make and drop 64 MiB tensors;
# prints the minor page faults of the steps (after a warm-up step).
STEPS = """
import resource, types
from tf_dlrm.cli.session import configure_threads
configure_threads(types.SimpleNamespace(intra_op_parallelism=1, inter_op_parallelism=1), 1)
import tensorflow as tf
x = tf.random.uniform([4096, 4096])
step = tf.function(lambda x: tf.reduce_sum(x * 2.0 + 1.0))
step(x)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(40):
    step(x)
print("faults", resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(extra: dict) -> int:
    env = worker_env(extra)
    if cpu_allocator.VARIABLE not in extra:
        env.pop(cpu_allocator.VARIABLE, None)
    result = subprocess.run([sys.executable, "-c", STEPS], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return int(result.stdout.split("faults")[-1])


def test_the_pool_is_the_default_and_large_tensors_stop_faulting():
    pooled, malloc = _faults({}), _faults({cpu_allocator.VARIABLE: "false"})
    # Each step's two 64 MiB temporaries are 32,768 fresh 4 KiB pages when they are mapped anew each
    # step; the pool reuses the same blocks, so its 40 steps fault far fewer pages than one step's worth.
    assert pooled < 16384, (pooled, malloc)
    # Where malloc hands large blocks back to the system (glibc on the EPYC machines: 655,400 faults for
    # the script alone), the pool must do 20 times better. Some machines' malloc keeps them (a Xeon
    # here faulted 1-3 pages either way): then there is nothing to compare.
    if malloc > 40 * 16384:
        assert pooled * 20 < malloc, (pooled, malloc)


def test_an_explicit_setting_wins_and_the_line_says_which(monkeypatch):
    monkeypatch.delenv(cpu_allocator.VARIABLE, raising=False)
    assert cpu_allocator.choose() and os.environ[cpu_allocator.VARIABLE] == "true"
    assert cpu_allocator.describe().startswith("CPU allocator: TensorFlow's BFC pool (TF_CPU_ALLOCATOR_USE_BFC=true")
    monkeypatch.setenv(cpu_allocator.VARIABLE, "False")
    assert not cpu_allocator.choose() and os.environ[cpu_allocator.VARIABLE] == "False"
    assert cpu_allocator.describe() == "CPU allocator: malloc (TF_CPU_ALLOCATOR_USE_BFC='False')"
    monkeypatch.setenv(cpu_allocator.VARIABLE, "1")
    assert cpu_allocator.choose()
