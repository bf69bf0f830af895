"""Horovod's cycle time (``--horovod_cycle_time_ms``, ``tf_dlrm.cli.cycle_time``): chosen from the
model and batch before ``hvd.init``, never over an environment's choice, and said in the run's output."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import HOROVODRUN, REPO, worker_env
from tf_dlrm.cli import cycle_time

CRITEO_CAPPED = ((512, 256, 128), (1024, 1024, 512, 256, 1))
TINY_MODEL = ["--embedding_dim=4", "--bottom_mlp_dims=8,4", "--top_mlp_dims=8,1", "--batch_size=256"]


def test_auto_sets_ten_ms_for_long_steps_only():
    environ = {}
    line = cycle_time.apply(None, *CRITEO_CAPPED, 16384, 2, environ)
    assert environ == {"HOROVOD_CYCLE_TIME": "10"} and line.startswith("horovod cycle time: 10 ms (auto: ")
    # The test model's step (8-4 / 8-1 at batch 256): Horovod's default stays.
    environ = {}
    line = cycle_time.apply(None, (8, 4), (8, 1), 256, 2, environ)
    assert environ == {} and line.startswith("horovod cycle time: 1 ms (Horovod default) (auto: 5,120 MLP")
    assert cycle_time.dense_macs_per_rank(*CRITEO_CAPPED, 16384, 2) == (512 * 256 + 256 * 128 + 1024 * 1024 + 1024 * 512
                                                                         + 512 * 256 + 256 * 1) * 8192


def test_the_flag_sets_it_and_the_environment_wins():
    environ = {}
    assert "7 ms (--horovod_cycle_time_ms)" in cycle_time.apply(7.0, (8, 4), (8, 1), 256, 2, environ)
    assert environ == {"HOROVOD_CYCLE_TIME": "7"}
    environ = {"HOROVOD_CYCLE_TIME": "3"}
    assert "3 ms (HOROVOD_CYCLE_TIME=3 from the environment)" in cycle_time.apply(7.0, *CRITEO_CAPPED, 16384, 2, environ)
    assert environ == {"HOROVOD_CYCLE_TIME": "3"}


@pytest.mark.parametrize("text", ["0", "-1", "fast", "inf", ""])
def test_bad_values_are_refused_naming_the_flag(text):
    with pytest.raises(ValueError, match="--horovod_cycle_time_ms"):
        cycle_time.parse_cycle_time(text)
    assert cycle_time.parse_cycle_time("auto") is None and cycle_time.parse_cycle_time("2.5") == 2.5


@pytest.mark.multirank
def test_main_under_horovodrun_sets_and_reports_it():
    command = [HOROVODRUN, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, "-c",
               "import os, runpy, sys\nsys.argv = ['main.py'] + sys.argv[1:]\n"
               "try:\n    runpy.run_path('main.py', run_name='__main__')\nfinally:\n"
               "    print('rank', os.environ['HOROVOD_RANK'], 'HOROVOD_CYCLE_TIME', os.environ.get('HOROVOD_CYCLE_TIME'),\n"
               "          'TF_CPU_ALLOCATOR_USE_BFC', os.environ.get('TF_CPU_ALLOCATOR_USE_BFC'), flush=True)",
               "--dataset_type=synthetic", "--feature_spec=feature_specs/synthetic_small.yaml", *TINY_MODEL,
               "--max_steps=2", "--evals_per_epoch=0", "--horovod_cycle_time_ms=7"]
    env = worker_env()
    env.pop("TF_CPU_ALLOCATOR_USE_BFC", None)  # main.py's own choice (tf_dlrm.cli.cpu_allocator) is checked too
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert output.count("horovod cycle time: 7 ms (--horovod_cycle_time_ms)") == 1, output[-3000:]  # rank 0 says it
    assert output.count("CPU allocator: TensorFlow's BFC pool (TF_CPU_ALLOCATOR_USE_BFC=true") == 1, output[-3000:]
    # Set in each rank's environment before hvd.init, where Horovod reads it.
    for rank in (0, 1):
        assert f"rank {rank} HOROVOD_CYCLE_TIME 7 TF_CPU_ALLOCATOR_USE_BFC true" in output, output[-3000:]


def test_main_refuses_a_bad_value_with_exit_2():
    result = subprocess.run([sys.executable, "main.py", "--dataset_path=/nowhere", "--horovod_cycle_time_ms=fast"],
                            cwd=REPO, env=worker_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "--horovod_cycle_time_ms='fast'" in result.stderr, result.stderr[-2000:]
