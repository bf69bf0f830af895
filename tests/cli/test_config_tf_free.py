"""Flags parse into plain frozen configs; the optimizer and loop settings, the sharding plan and the
FeatureSpec import no TensorFlow.

Each check runs in a fresh interpreter, since this test process may have imported TensorFlow already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PARSE_FLAGS = """
import json, sys
from absl import flags
import tf_dlrm.cli.flags as run_flags
run_flags.define_flags()
flags.FLAGS(["main.py", "--dataset_path=/nowhere", "--embedding_dims=cat_0.bin:16", "--interaction=cat",
             "--optimizer=sgd", "--embedding_optimizer=adagrad", "--warmup_steps=3", "--decay_start_step=5",
             "--decay_steps=7", "--max_steps=9", "--amp=auto"])
config = run_flags.config_from_flags(flags.FLAGS)
print(json.dumps({
    "imported": sorted(m for m in ("tensorflow", "keras", "horovod", "horovod.tensorflow") if m in sys.modules),
    "interaction": config.model.params.interaction, "embedding_dims": config.model.embedding_dims,
    "schedule": [config.optimizer.schedule(s) for s in (0, 4, 8, 20)], "max_steps": config.loop.max_steps,
    "embedding_optimizer": config.optimizer.embedding_optimizer, "amp": config.amp.value,
}))
"""


def run_fresh(code: str) -> dict:
    completed = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                               env={**os.environ, "PYTHONPATH": REPO})
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_flags_parse_into_the_run_config():
    # TensorFlow may be imported by now: the tables' and models' configs live in their packages
    # (tf_dlrm.embedding, tf_dlrm.models), whose __init__ imports the layers. Horovod may not: it reads
    # its settings (HOROVOD_CYCLE_TIME, chosen from the flags) when it starts.
    result = run_fresh(PARSE_FLAGS)
    assert not {"horovod", "horovod.tensorflow"} & set(result["imported"]), f"parsing flags imported {result['imported']}"
    # The configs really are the parsed ones (the subprocess did the work, not an early exit).
    assert result["interaction"] == "cat"
    assert result["embedding_dims"] == [["cat_0.bin", 16]]
    assert result["schedule"] == pytest.approx([0.001 / 3, 0.001, 0.001 * (4 / 7) ** 2, 0.0])
    assert result["max_steps"] == 9
    assert result["embedding_optimizer"] == "adagrad"
    assert result["amp"] == "auto"


@pytest.mark.parametrize("module", ["tf_dlrm.optimizers.settings", "tf_dlrm.train.loop_config", "tf_dlrm.sharding.planner",
                                    "tf_dlrm.sharding.memory_plan", "tf_dlrm.spec.feature_spec"])
def test_each_config_module_imports_no_tensorflow(module):
    result = run_fresh(f"import json, sys, {module}\n"
                       "print(json.dumps({'imported': sorted(m for m in ('tensorflow', 'keras') if m in sys.modules)}))")
    assert result["imported"] == []


EVALUATION_FLAGS = """
import json
from absl import flags
import tf_dlrm.cli.flags as run_flags
run_flags.define_flags()

def parse(*argv):
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["main.py", "--dataset_path=/nowhere", *argv])
    try:
        config = run_flags.config_from_flags(flags.FLAGS)
    except ValueError as error:
        return str(error)
    loop = config.loop
    return [loop.evals_per_epoch, loop.eval_every_steps, loop.eval_max_batches, loop.early_stopping_patience,
            loop.early_stopping_min_delta, config.keep_best, config.test_split]

print(json.dumps({
    "default": parse(),
    "stopping": parse("--eval_every_steps=7", "--eval_max_batches=3", "--early_stopping_patience=2",
                      "--early_stopping_min_delta=0.001", "--valid_split=valid", "--test_split=test"),
    "both": parse("--evals_per_epoch=1", "--eval_every_steps=7"),
    "same_split": parse("--valid_split=test", "--test_split=test"),
    "negative": parse("--early_stopping_patience=-1"),
}))
"""


def test_evaluation_and_early_stopping_flags_parse_and_refuse():
    result = run_fresh(EVALUATION_FLAGS)
    assert result["default"] == [1, 0, 0, 0, 0.0, False, "auto"]
    # --eval_every_steps replaces the per-epoch schedule; early stopping keeps the best state.
    assert result["stopping"] == [0, 7, 3, 2, 0.001, True, "test"]
    # Given both, even --evals_per_epoch at its default value: one line naming both.
    assert result["both"] == ("Expected one of --evals_per_epoch and --eval_every_steps. "
                              "Received: --evals_per_epoch=1 --eval_every_steps=7")
    assert result["same_split"].startswith("Expected --test_split to differ from --valid_split")
    assert result["same_split"].endswith("Received: --test_split=test --valid_split=test")
    assert result["negative"] == "Expected early_stopping_patience >= 0. Received: early_stopping_patience=-1"
