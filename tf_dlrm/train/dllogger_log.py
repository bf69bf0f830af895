"""NVIDIA's DLLogger log (``--log_format=dllogger``): the records DLE's DLRM writes, for the scripts that parse them.

Each line is ``DLLL `` then one JSON object, as DLLogger's ``JSONStreamBackend`` writes it:
``{"timestamp": "<epoch seconds>", "datetime": "...", "elapsedtime": "<seconds>", "type": "LOG",
"step": STEP, "data": {...}}``. NVIDIA's DLRM_and_DCNv2 (``main.py``, ``utils/logging.py``) logs:

- ``step: "PARAMETER"``: every flag's value, first;
- after training, ``step: []``: ``throughput`` (samples/s), ``mean_step_time_ms``, ``auc`` and
  ``validation_loss`` (the best over the evaluations, as NVIDIA's);
- ``--mode=eval``, ``step: []``: ``auc`` and ``test_loss``;
- ``--mode=inference``, ``step: []``: ``mean_inference_throughput`` (samples/s), ``mean_inference_latency``
  and ``p90/p95/p99_inference_latency`` (seconds), one record per timed batch size here.

tf_dlrm adds, as NVIDIA's records do not forbid, ``step: [step]`` records of training progress (``loss``,
``throughput``, ``learning_rate``) and of each evaluation (``auc``, ``validation_loss``); a script
reading the ``step: []`` record finds NVIDIA's figures.
"""

from __future__ import annotations

import datetime
import json

from tf_dlrm.io import files
from tf_dlrm.io.json_values import json_value


class DLLoggerLog:
    """Writes DLLogger ``LOG`` records to ``path`` (truncated), translating the run's events."""

    def __init__(self, path: str, parameters: dict | None = None):
        self._file = files.open_file(path, "w", encoding="utf-8")
        self._started = datetime.datetime.now()
        self._evaluations: list[dict] = []
        self._batch_size = None
        self.log("PARAMETER", dict(parameters or {}))

    def log(self, step, data: dict) -> None:
        now = datetime.datetime.now()
        record = {"timestamp": str(now.timestamp()), "datetime": str(now),
                  "elapsedtime": str((now - self._started).total_seconds()), "type": "LOG",
                  "step": list(step) if isinstance(step, tuple) else step, "data": {k: json_value(v) for k, v in data.items()}}
        self._file.write("DLLL " + json.dumps(record) + "\n")
        self._file.flush()

    def event(self, event: str, fields: dict) -> None:
        """One of the run's events (:meth:`tf_dlrm.train.reporting.Reporter.event`) as NVIDIA's records."""
        if event == "config":
            self._batch_size = fields.get("batch_size")
        elif event == "train":
            self.log((fields["step"],), {"loss": fields.get("loss"), "throughput": fields.get("samples_per_s"),
                                         "learning_rate": fields.get("lr")})
        elif event == "eval":
            self._evaluations.append(fields)
            self.log((fields["step"],), {"auc": fields.get("auc"), "validation_loss": fields.get("logloss")})
        elif event == "inference":
            self.log((), {"mean_inference_throughput": fields["samples_per_s"], "mean_inference_latency": fields["mean_ms"] / 1e3,
                          **{f"p{p}_inference_latency": fields[f"p{p}_ms"] / 1e3 for p in (90, 95, 99)},
                          "batch_size": fields["batch_size"]})
        elif event == "final":
            self._final(fields)

    def _final(self, fields: dict) -> None:
        mode = fields.get("mode", "train")
        if mode == "eval":
            self.log((), {"auc": fields.get("auc"), "test_loss": fields.get("logloss")})
        elif mode == "train":
            throughput = fields.get("train_samples_per_s")
            step_ms = self._batch_size / throughput * 1e3 if throughput and self._batch_size else None
            # NVIDIA reports the best AUC and the lowest loss over the run's evaluations (0 and 1e6 without any).
            aucs = [e["auc"] for e in self._evaluations if e.get("auc") is not None]
            losses = [e["logloss"] for e in self._evaluations if e.get("logloss") is not None]
            self.log((), {"throughput": throughput, "mean_step_time_ms": step_ms,
                          "auc": max(aucs) if aucs else fields.get("auc"),
                          "validation_loss": min(losses) if losses else fields.get("logloss")})

    def close(self) -> None:
        self._file.close()
