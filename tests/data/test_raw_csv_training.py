"""A csv of raw strings and raw numbers trains under ``horovodrun -np 2`` with no user code: once with
``encode: vocabulary`` (fixed tables), once with ``encode: hash`` (dynamic tables)."""

from __future__ import annotations

import json
import math

import pytest

from conftest import launch
from raw_csv import CITIES, write_dataset
from tf_dlrm.data.transcode import transcode
from tf_dlrm.spec.feature_spec import FeatureSpec


@pytest.mark.multirank
@pytest.mark.parametrize("dynamic", [False, True], ids=["vocabulary_fixed_tables", "hash_dynamic_tables"])
def test_raw_csv_trains_on_two_ranks(tmp_path, dynamic):
    spec_path = write_dataset(tmp_path, rows=12000, dynamic=dynamic)
    written = transcode(spec_path, str(tmp_path / "binary"))
    if not dynamic:
        assert FeatureSpec.load(written.source).cardinalities()[0] == len(CITIES) + 1
    log = tmp_path / "log.jsonl"
    completed = launch(2, ["main.py", f"--dataset_path={tmp_path / 'binary'}", "--embedding_dim=8", "--bottom_mlp_dims=16,8",
                           "--top_mlp_dims=16,1", "--batch_size=256", "--epochs=3", "--seed=1",
                           "--embedding_learning_rate=0.03", f"--log_path={log}"])
    events = [json.loads(line) for line in open(log, encoding="utf-8")]
    final = events[-1]
    print(f"\n{'hash/dynamic' if dynamic else 'vocabulary/fixed'}: final {final}")
    losses = [e["loss"] for e in events if "loss" in e]
    assert losses and all(math.isfinite(loss) for loss in losses), completed.stdout[-2000:]
    assert final["world_size"] == 2 and math.isfinite(final["logloss"]) and final["auc"] > 0.6, final
    if dynamic:
        tables = next(e["tables"] for e in events if e["event"] == "dynamic_tables")
        assert tables["city"]["rows"] == len(CITIES) and tables["device"]["rows"] == 3
