"""Every bad input tried against ``main.py``, with the message it must get (the catalog of issue #15).

Each case damages a fresh tiny dataset (or passes bad flags), runs the real entry point in a
subprocess (``python main.py``, or ``horovodrun -np 2``) and checks the exit status and that stderr
holds the expected message and no Python traceback. On the main of before issue #15 every case here
either trained to exit 0 (ids, NaN, typo split), or failed with a traceback that named no file.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Callable

import pytest

from conftest import launch, run_python
from tiny_dataset import TINY_MODEL, poke_id, poke_label, poke_numerical, write_tiny


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    damage: Callable  # (dataset directory, tmp_path) -> None
    flags: tuple  # extra flags; "{data}" and "{tmp}" are filled in
    expected: str  # a regex searched in stderr
    ranks: int = 1
    exit_code: int = 2


def _nothing(data, tmp):
    pass


def _make_file(name):
    def make(data, tmp):
        open(os.path.join(tmp, name), "w").write("a file, not a directory\n")
    return make


def _make_directory(name):
    def make(data, tmp):
        os.makedirs(os.path.join(tmp, name))
    return make


def _empty_test_split(data, tmp):
    for name in os.listdir(os.path.join(data, "test")):
        open(os.path.join(data, "test", name), "wb").close()


def _huge_table(data, tmp):
    """cat_1.bin indexes a table of 2**40 rows (16 TiB of float32 at width 4): more than any host here."""
    import numpy as np
    import yaml

    for split in ("train", "test"):
        path = os.path.join(data, split, "cat_1.bin")
        np.fromfile(path, np.int16).astype(np.int64).tofile(path)
    spec_path = os.path.join(data, "feature_spec.yaml")
    with open(spec_path) as handle:
        spec = yaml.safe_load(handle)
    spec["feature_spec"]["cat_1.bin"].update(cardinality=2**40, dtype="int64")
    with open(spec_path, "w") as handle:
        yaml.safe_dump(spec, handle)


ID_MESSAGE = r"split 'train', feature '{feature}', file \S*train/{feature}: sample {sample} has id {value} outside \[0, {cardinality}\)"

CASES = [
    Case("id too large, small table", lambda d, t: poke_id(d, "train", 0, 300, 5), (),
         ID_MESSAGE.format(feature="cat_0.bin", sample=300, value=5, cardinality=3)),
    Case("negative id, small table", lambda d, t: poke_id(d, "train", 0, 7, -1), (),
         ID_MESSAGE.format(feature="cat_0.bin", sample=7, value=-1, cardinality=3)),
    Case("id too large, big table", lambda d, t: poke_id(d, "train", 1, 1000, 7000), (),
         ID_MESSAGE.format(feature="cat_1.bin", sample=1000, value=7000, cardinality=5000)),
    Case("id too large, small (replicated) table, 2 ranks", lambda d, t: poke_id(d, "train", 0, 300, 5), (),
         ID_MESSAGE.format(feature="cat_0.bin", sample=300, value=5, cardinality=3), ranks=2),
    Case("id too large, big (sharded) table, 2 ranks", lambda d, t: poke_id(d, "train", 1, 1000, 7000), (),
         ID_MESSAGE.format(feature="cat_1.bin", sample=1000, value=7000, cardinality=5000), ranks=2),
    Case("bad id in the validation split", lambda d, t: poke_id(d, "test", 1, 10, 5000), (),
         r"split 'test', feature 'cat_1.bin', file \S*test/cat_1.bin: sample 10 has id 5000 outside \[0, 5000\)"),
    Case("NaN numerical value", lambda d, t: poke_numerical(d, "train", 513, 2, float("nan")), (),
         r"split 'train', file \S*train/numerical.bin: sample 513, feature 'num_2' is nan"),
    Case("diverging learning rate", _nothing, ("--learning_rate=1e6", "--epochs=3"),
         r"training loss is (nan|inf) at step \d+ \(learning rate 1e\+06: embeddings \(sgd\) 1e\+06, MLPs \(sgd\) 1e\+06\); "
         r"the last finite loss was \S+ at step \d+"),
    Case("diverging learning rate, 2 ranks", _nothing, ("--learning_rate=1e6", "--epochs=3"),
         r"training loss is (nan|inf) at step \d+ \(learning rate 1e\+06: embeddings \(sgd\) 1e\+06, MLPs \(sgd\) 1e\+06\); "
         r"the last finite loss was", ranks=2),
    Case("--embedding_min_count of 0", _nothing, ("--embedding_min_count=0",),
         r"Expected --embedding_min_count >= 1 \(steps that looked a row up before it is updated\)\. "
         r"Received: --embedding_min_count=0"),
    Case("--top_mlp_dropout of 1", _nothing, ("--top_mlp_dropout=1",),
         re.escape("Expected --top_mlp_dropout in [0, 1) (the fraction of hidden units zeroed in training). "
                   "Received: --top_mlp_dropout=1.0")),
    Case("typo in --valid_split", _nothing, ("--valid_split=tset",),
         r"--valid_split=tset is not a split of \S+feature_spec.yaml \(its splits: \['train', 'test'\]\); name one of them, "
         r"or give --valid_split='' to train without evaluation"),
    # The tiny dataset has train and test only: --select_on_test lets the patience choose on test at all.
    Case("early stopping that can never act", _nothing,
         ("--eval_every_steps=100", "--early_stopping_patience=2", "--max_steps=6", "--select_on_test"),
         re.escape("--early_stopping_patience=2 can never stop this run: --eval_every_steps=100 evaluates 0 time(s) "
                   "before its last step (6 steps), and a stop needs 3. Expected evaluations often enough for the patience "
                   "to act (a smaller --eval_every_steps, or a longer run). Received: --eval_every_steps=100, "
                   "--early_stopping_patience=2, 6 steps")),
    # 8 MiB of dense weights (plus twice that of Adam state), tables of 78 KiB: the budget covers both.
    Case("--memory_per_rank below the dense weights", _nothing,
         ("--bottom_mlp_dims=1024,1024,4", "--top_mlp_dims=1024,1024,1", "--optimizer=adam", "--memory_per_rank=1MiB"),
         r"--memory_per_rank=1.00 MiB: the model does not fit: rank 0: 24.31 MiB \(tables 78.17 KiB, optimizer state "
         r"0 B, hot rows 0 B, dense weights 8.08 MiB and their optimizer state 16.16 MiB\)\. Its dense weights"),
    Case("empty validation split", _empty_test_split, (),
         r"--valid_split=test: the split holds no samples, so nothing can be evaluated on it"),
    Case("--save_checkpoint_path is a file", _make_file("model"), ("--save_checkpoint_path={tmp}/model",),
         r"--save_checkpoint_path=\S+/model is a file; expected a directory"),
    Case("--log_path is a directory", _make_directory("logs"), ("--log_path={tmp}/logs",),
         r"--log_path=\S+/logs is a directory; expected a file name"),
    Case("--tensorboard_dir is a file", _make_file("board"), ("--tensorboard_dir={tmp}/board",),
         r"--tensorboard_dir=\S+/board is a file; expected a directory"),
    Case("a table larger than the host's memory, no --memory_per_rank", _huge_table, (),
         r"the sharding plan does not fit in memory: rank 0 needs 16.00 TiB for embedding tables .* more than the "
         r"\S+ \S+ left by (MemAvailable of host|the limit of memory cgroup).* Largest tables on rank 0 \(with their "
         r"optimizer state\): 'cat_1.bin' 16.00 TiB"),
    # numpy reads a bool byte 2 or 255 as True: the reader reads the label file as bytes to refuse them.
    Case("label byte 2", lambda d, t: poke_label(d, "train", 1030, 2), (),
         r"split 'train', feature 'label', file \S*train/label.bin: sample 1030 has label 2; expected 0 or 1"),
    Case("label byte 255 in the validation split, 2 ranks", lambda d, t: poke_label(d, "test", 300, 255), (),
         r"split 'test', feature 'label', file \S*test/label.bin: sample 300 has label 255; expected 0 or 1", ranks=2),
    Case("inf numerical value", lambda d, t: poke_numerical(d, "train", 2047, 0, float("inf")), (),
         r"split 'train', file \S*train/numerical.bin: sample 2047, feature 'num_0' is inf"),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_bad_input_is_refused_with_its_message(case, tmp_path):
    if case.ranks > 1:
        pytest.importorskip("horovod")
    data = write_tiny(tmp_path / "data")
    case.damage(data, str(tmp_path))
    flags = [f.format(data=data, tmp=tmp_path) for f in case.flags]
    args = ["main.py", f"--dataset_path={data}", *TINY_MODEL, *flags]
    if case.ranks == 1:
        completed = run_python(args, check=False, timeout=300)
    else:
        completed = launch(case.ranks, args, check=False, timeout=300)
    output = completed.stderr + completed.stdout
    assert completed.returncode != 0, output[-3000:]
    if case.ranks == 1:
        assert completed.returncode == case.exit_code, output[-3000:]
    assert re.search(case.expected, output), output[-3000:]
    if case.ranks == 1:  # (under horovodrun, horovodrun itself reports the failed rank)
        assert "Traceback" not in completed.stderr, output[-3000:]


def test_an_evaluation_schedule_longer_than_the_run_is_noted(tmp_path):
    data = write_tiny(tmp_path / "data")
    completed = run_python(["main.py", f"--dataset_path={data}", *TINY_MODEL, "--eval_every_steps=100", "--max_steps=6"],
                           timeout=300)
    assert ("note: --eval_every_steps=100 is longer than the run (6 steps): the validation split is evaluated only at "
            "the end") in completed.stderr, completed.stderr[-3000:]


def test_an_empty_valid_split_flag_trains_without_evaluation(tmp_path):
    import json

    data = write_tiny(tmp_path / "data", splits=("train",))
    log = tmp_path / "log.jsonl"
    run_python(["main.py", f"--dataset_path={data}", *TINY_MODEL, "--valid_split=", f"--log_path={log}"], timeout=300)
    final = json.loads(open(log).read().splitlines()[-1])
    assert final["auc"] is None and final["steps"] == 8
