"""Resident memory of a process during a block: what a checkpoint save or restore reports it cost."""

from __future__ import annotations

import threading

import tensorflow as tf

from tf_dlrm.parallel import collectives


class MemoryWatch:
    """Resident memory of this process before and at its peak during a block (sampled every 5 ms)."""

    def __enter__(self):
        import psutil

        self._process = psutil.Process()
        self.before = self.peak = self._process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self._process.memory_info().rss)

    def __exit__(self, *exc_info):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)
        return False

    def gathered(self, env) -> list[dict]:
        """Every rank's figures in MiB, on every rank (collective)."""
        mine = tf.constant([[self.before, self.peak]], tf.int64)
        rows = collectives.allgather(env, mine, name="checkpoint_memory").numpy()
        return [{"rank": r, "rss_before_mib": round(b / 2**20, 1), "peak_rss_mib": round(p / 2**20, 1)} for r, (b, p) in enumerate(rows)]
