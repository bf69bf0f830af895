"""The local engine forks its workers from the caller's process, which may hold TensorFlow objects
(``main.py`` does not, a test process or a notebook does). A tf.data iterator destroyed in a forked
worker waits forever for threads the fork did not copy: a test process once hung there. The engine
collects the caller's garbage before it forks and keeps the rest out of the workers' collections."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO, worker_env

# Leaves a started tf.data iterator (prefetch threads running) in unreachable garbage, then forks a
# pool whose workers collect garbage first thing.
SCRIPT = """
import gc
import tensorflow as tf
from preprocessing.local_engine import LocalEngine

gc.disable()
iterator = iter(tf.data.Dataset.range(100).map(lambda x: x + 1).prefetch(4))
next(iterator)
cycle = [iterator]
cycle.append(cycle)
del iterator, cycle
with LocalEngine(num_workers=2)._executor(initializer=gc.collect) as executor:
    print("workers", sorted(executor.map(abs, [-1, -2, -3])))
"""


def test_workers_forked_beside_a_live_tf_data_iterator_do_not_hang():
    result = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=worker_env(), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "workers [1, 2, 3]" in result.stdout
