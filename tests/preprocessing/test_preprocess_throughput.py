"""benchmarks/preprocess_throughput.py runs end to end on a tiny input and prints its JSON contract."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tiny_benchmark_prints_one_json_line_per_engine(tmp_path):
    engines = ["local", "naive_python"] + (["spark"] if importlib.util.find_spec("pyspark") else [])
    command = [
        sys.executable, os.path.join(REPOSITORY, "benchmarks", "preprocess_throughput.py"), "--rows=3000",
        "--repeats=1", f"--engines={','.join(engines)}", f"--work_dir={tmp_path}", "--spark_master=local[2]",
    ]
    result = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [r["engine"] for r in records] == engines
    for record in records:
        assert record["benchmark"] == "preprocess_throughput"
        assert record["rows"] == 3000
        assert set(record["rows_per_s"]) == {"median", "min", "max"}
        assert all(0 < value < float("inf") for value in record["rows_per_s"].values()), record
        assert record["peak_rss_mib"] > 0
        if record["engine"] != "local":
            assert record["identical_to_local"] is True, record
