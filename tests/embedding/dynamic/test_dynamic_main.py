"""``main.py`` on a spec whose categorical features are dynamic tables: trains on 1 and 2 ranks,
reports its tables' counters, refuses bad specs with clear errors (checkpoints, resume, eval and
export: test_dynamic_main_checkpoint.py). A spec mixing dynamic tables (multi-hot ones too) with fixed
ones trains on 2 ranks as on 1, and its 2-rank checkpoint evaluates the same on 1 (its export:
tests/cli/test_export_multi_hot.py)."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import launch, make_synthetic_small, run_python

FLAGS = ["--embedding_dim=16", "--bottom_mlp_dims=64,16", "--top_mlp_dims=64,32,1", "--batch_size=1024",
         "--learning_rate=1.0", "--epochs=1", "--print_freq=1", "--seed=7", "--optimizer=sgd", "--embedding_optimizer=sgd"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    directory = make_synthetic_small(tmp_path_factory.mktemp("dynamic_main"), seed=2, num_train=60_000, num_valid=20_000)
    spec = yaml.safe_load((directory / "feature_spec.yaml").read_text())
    for name in spec["channel_spec"]["categorical"]:
        spec["feature_spec"][name].update(dynamic=True, capacity=spec["feature_spec"][name]["cardinality"])
    (directory / "dynamic.yaml").write_text(yaml.safe_dump(spec))
    return directory


def events(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


@pytest.mark.slow
@pytest.mark.multirank
def test_dynamic_tables_train_on_one_and_two_ranks(dataset, tmp_path):
    runs = {}
    for ranks in (1, 2):
        log = tmp_path / f"np{ranks}.jsonl"
        args = ["main.py", f"--dataset_path={dataset}", "--feature_spec=dynamic.yaml", f"--log_path={log}", *FLAGS]
        launch(2, args) if ranks == 2 else run_python(args)
        runs[ranks] = events(log)
    spec = yaml.safe_load((dataset / "dynamic.yaml").read_text())
    for ranks, lines in runs.items():
        final = lines[-1]
        assert final["event"] == "final" and final["world_size"] == ranks
        assert final["auc"] > 0.75, f"np{ranks}: AUC {final['auc']}"
        tables = next(e["tables"] for e in lines if e["event"] == "dynamic_tables")
        for name, counters in tables.items():
            assert 0 < counters["rows"] <= spec["feature_spec"][name]["cardinality"]
            assert counters["evictions"] == 0 and counters["rejections"] == 0
    # Same keys, same rows, same updates: the tables hold the same keys, and the printed loss (the
    # global batch's mean) agrees to float32 roundoff step by step. Only the first 20 steps are
    # compared: at --learning_rate=1.0 the two runs' roundoff-level differences (measured: <= 6e-8
    # up to step 28) grow about 10x per step from step ~30 (7e-4 at step 40), so their final AUCs
    # differ by ~2e-3 (0.77373 vs 0.77624): the amplification of roundoff by this learning rate.
    first, second = ([e for e in runs[n] if e["event"] == "dynamic_tables"][0]["tables"] for n in (1, 2))
    assert first == second
    losses = [{e["step"]: e["loss"] for e in runs[n] if e["event"] == "train"} for n in (1, 2)]
    for step in range(1, 21):
        assert abs(losses[0][step] - losses[1][step]) <= 1e-5, (step, losses[0][step], losses[1][step])


def test_capacity_zero_is_refused_naming_the_feature(dataset, tmp_path):
    spec = yaml.safe_load((dataset / "dynamic.yaml").read_text())
    spec["feature_spec"]["cat_3.bin"]["capacity"] = 0
    (dataset / "zero.yaml").write_text(yaml.safe_dump(spec))
    completed = run_python(["main.py", f"--dataset_path={dataset}", "--feature_spec=zero.yaml", *FLAGS], check=False)
    assert completed.returncode != 0
    assert "feature_spec.cat_3.bin.capacity: dynamic feature 'cat_3.bin' needs a positive integer capacity. Received: 0" in (
        completed.stdout + completed.stderr)


def test_xla_step_inserts_keys_too(dataset, tmp_path):
    """With --xla the trainer calls the embedding outside the model: it must still be in training."""
    log = tmp_path / "xla.jsonl"
    run_python(["main.py", f"--dataset_path={dataset}", "--feature_spec=dynamic.yaml", f"--log_path={log}", "--xla",
                "--max_steps=5", *FLAGS])
    tables = next(e["tables"] for e in events(log) if e["event"] == "dynamic_tables")
    assert all(c["rows"] > 0 for c in tables.values()), tables


@pytest.fixture(scope="module")
def mixed_dataset(tmp_path_factory):
    """synthetic_multi_hot (one-hot and multi-hot features, widths 8 and 16) with three features made dynamic:
    ``cat_2.bin`` one-hot, ``cat_3.bin`` 5 ids mean-pooled, ``cat_4.bin`` 2 ids summed (one width, 16)."""
    import os

    from tf_dlrm.data.synthetic import generate
    from tf_dlrm.spec.feature_spec import FeatureSpec

    directory = tmp_path_factory.mktemp("mixed_main")
    spec = FeatureSpec.load(os.path.join(os.path.dirname(__file__), "..", "..", "..", "feature_specs",
                                         "synthetic_multi_hot.yaml"), check_files=False)
    generate(spec, str(directory), 10_240, 2_048, seed=1)
    spec = yaml.safe_load((directory / "feature_spec.yaml").read_text())
    for name in MIXED_DYNAMIC:
        spec["feature_spec"][name].update(dynamic=True, capacity=spec["feature_spec"][name]["cardinality"], embedding_dim=16)
    (directory / "mixed.yaml").write_text(yaml.safe_dump(spec))
    return directory


MIXED_DYNAMIC = ("cat_2.bin", "cat_3.bin", "cat_4.bin")
MIXED_FLAGS = ["--feature_spec=mixed.yaml", "--interaction=cat", "--bottom_mlp_dims=64,16", "--top_mlp_dims=64,32,1",
               "--batch_size=512", "--epochs=1", "--print_freq=1", "--learning_rate=0.5", "--optimizer=sgd",
               "--embedding_optimizer=sgd", "--calibration=none", "--seed=7"]


@pytest.mark.multirank
def test_dynamic_tables_beside_fixed_ones_train_on_two_ranks_as_on_one(mixed_dataset, tmp_path):
    """The plan places the five fixed tables only (the dynamic ones route keys by hash); 2 ranks see the same loss
    at every step as one process (the same sums in another order: measured <= 6e-8 over the 20 steps), hold the
    same keys, reach the same AUC, and their checkpoint evaluated by one process gives that AUC again."""
    runs = {}
    for ranks in (1, 2):
        log = tmp_path / f"np{ranks}.jsonl"
        args = ["main.py", f"--dataset_path={mixed_dataset}", f"--log_path={log}", *MIXED_FLAGS]
        if ranks == 2:
            launch(2, args + [f"--save_checkpoint_path={tmp_path / 'checkpoints'}"])
        else:
            run_python(args)
        runs[ranks] = events(log)
    config = next(e for e in runs[2] if e["event"] == "config")
    assert [t["name"] for t in config["plan"]["tables"]] == ["cat_0.bin", "cat_1.bin", "cat_5.bin", "cat_6.bin", "cat_7.bin"]
    first, second = ([e for e in runs[n] if e["event"] == "dynamic_tables"][0]["tables"] for n in (1, 2))
    assert first == second and sorted(first) == list(MIXED_DYNAMIC)
    assert all(c["rows"] > 0 and c["evictions"] == 0 and c["rejections"] == 0 for c in first.values())
    losses = [{e["step"]: e["loss"] for e in runs[n] if e["event"] == "train"} for n in (1, 2)]
    assert sorted(losses[0]) == sorted(losses[1]) == list(range(1, 21))
    for step in losses[0]:
        assert abs(losses[0][step] - losses[1][step]) <= 1e-5, (step, losses[0][step], losses[1][step])
    finals = [runs[n][-1] for n in (1, 2)]
    assert finals[0]["auc"] > 0.6 and abs(finals[0]["auc"] - finals[1]["auc"]) <= 1e-6, finals
    log = tmp_path / "eval.jsonl"
    run_python(["main.py", f"--dataset_path={mixed_dataset}", f"--log_path={log}", "--mode=eval",
                f"--restore_checkpoint_path={tmp_path / 'checkpoints'}", *MIXED_FLAGS])
    evaluated = events(log)[-1]
    assert abs(evaluated["auc"] - finals[1]["auc"]) <= 1e-6, (evaluated, finals[1])
