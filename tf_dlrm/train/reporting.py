"""What a run tells its user: progress on rank 0, JSON-lines log, TensorBoard scalars, a summary."""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Any

import tensorflow as tf

from tf_dlrm.io import files
from tf_dlrm.io.json_values import json_value

SUMMARY_LABEL_WIDTH = 26  # the summary's label column; longer labels run into the values


class Reporter:
    """Writes only on the chief rank; every other rank gets a silent reporter.

    Args:
        enabled: whether this rank reports (rank 0).
        log_path: the log file, or None.
        tensorboard_dir: directory for TensorBoard scalars, or None.
        stream: where progress goes (stderr by default).
        log_format: ``jsonl`` (one JSON object per event) or ``dllogger`` (NVIDIA's DLLogger records,
            :mod:`tf_dlrm.train.dllogger_log`).
        parameters: the run's flags, a DLLogger log's first record.
    """

    def __init__(self, enabled: bool, log_path: str | None = None, tensorboard_dir: str | None = None, stream=None,
                 log_format: str = "jsonl", parameters: dict | None = None):
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self._log = None
        self._writer = None
        self._dllogger = None
        self._started = time.time()
        if not enabled:
            return
        if log_format not in ("jsonl", "dllogger"):
            raise ValueError(f"Expected --log_format to be jsonl or dllogger. Received: --log_format={log_format}")
        if log_path:
            files.makedirs(files.dirname(files.absolute(log_path)))
            if log_format == "dllogger":
                from tf_dlrm.train.dllogger_log import DLLoggerLog

                self._dllogger = DLLoggerLog(log_path, parameters)
            else:
                # (A remote log is rewritten whole on each flush by some object stores: fine for a run's events.)
                self._log = files.open_file(log_path, "w", encoding="utf-8")
        if tensorboard_dir:
            self._writer = tf.summary.create_file_writer(tensorboard_dir)

    def event(self, event: str, **fields: Any) -> None:
        if self.enabled and self._dllogger is not None:
            self._dllogger.event(event, fields)
        if not self.enabled or self._log is None:
            return
        record = {"event": event, **{k: json_value(v) for k, v in fields.items()}}
        self._log.write(json.dumps(record) + "\n")
        self._log.flush()

    def scalars(self, step: int, **values: float) -> None:
        if not self.enabled or self._writer is None:
            return
        with self._writer.as_default():
            for name, value in values.items():
                if value is not None and math.isfinite(value):
                    tf.summary.scalar(name, value, step=step)
        self._writer.flush()

    def say(self, text: str) -> None:
        if self.enabled:
            print(text, file=self.stream, flush=True)

    def progress(self, step: int, total: int | None, loss: float, rate: float, samples_per_s: float) -> None:
        if not self.enabled:
            return
        if total:
            filled = int(30 * min(step, total) / total)
            bar = f"[{'#' * filled}{'.' * (30 - filled)}] {step}/{total}"
        else:
            bar = f"step {step}"
        print(f"{bar}  loss {loss:.5f}  lr {rate:.4g}  {samples_per_s:,.0f} samples/s", file=self.stream, flush=True)

    def summary(self, lines: dict[str, Any]) -> None:
        if not self.enabled:
            return
        # A long label (a figure's variant: "validation NE (uncalibrated)") runs into the value column rather
        # than pushing every other line's value to the right.
        width = max([len(k) for k in lines if len(k) <= SUMMARY_LABEL_WIDTH] or [SUMMARY_LABEL_WIDTH])
        rule = "=" * (width + 30)
        print(rule, file=self.stream)
        for key, value in lines.items():
            print(f"{key:<{width}}  {_format(value)}", file=self.stream)
        print(rule, file=self.stream, flush=True)

    def close(self) -> None:
        if self._log:
            self._log.close()
        if self._dllogger:
            self._dllogger.close()
        if self._writer:
            self._writer.close()


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6f}" if abs(value) < 1000 else f"{value:,.1f}"
    return str(value)
