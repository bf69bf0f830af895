"""``main.py`` end to end: learns synthetic data, N ranks equal one, NVIDIA-layout data trains, errors.

These run the real entry point in subprocesses (``python main.py`` and ``horovodrun -np 2``).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import yaml

from conftest import launch, make_synthetic_small, run_python

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL_FLAGS = [
    "--embedding_dim=16", "--bottom_mlp_dims=64,16", "--top_mlp_dims=64,32,1", "--batch_size=1024",
    "--learning_rate=1.0", "--epochs=3", "--print_freq=100", "--seed=7", "--optimizer=sgd", "--embedding_optimizer=sgd",
]
# The N-ranks-equal-one-process runs below train at a quarter of that rate. At 1.0 (and 0.5) plain SGD
# is chaotic on this data: rounding differences of the float sums (1 rank against 2, TensorFlow
# 2.18 against 2.21) split the loss curves within 100 steps (0.508 against 0.531 at step 100), and
# the final AUCs then differ by whatever the two trajectories happen to reach (0.0006 to 0.0011
# seen), a margin no arithmetic gives. At 0.25 the step-100 losses of 1 and 2 ranks agree to 1e-5
# and the final AUCs to 3e-5, so the 1e-3 below is a check of the distributed code again.
EQUIVALENCE_FLAGS = [f if not f.startswith("--learning_rate=") else "--learning_rate=0.25" for f in MODEL_FLAGS]


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return make_synthetic_small(tmp_path_factory.mktemp("synthetic_small"), seed=1)


def final_record(log_path) -> dict:
    lines = [json.loads(line) for line in open(log_path, encoding="utf-8").read().splitlines()]
    assert lines[-1]["event"] == "final"
    return lines[-1]


def train_losses(log_path) -> dict[int, float]:
    lines = [json.loads(line) for line in open(log_path, encoding="utf-8").read().splitlines()]
    return {line["step"]: line["loss"] for line in lines if line["event"] == "train"}


@pytest.fixture(scope="module")
def single_process_run(synthetic, tmp_path_factory):
    log = tmp_path_factory.mktemp("np1") / "log.jsonl"
    run_python(["main.py", f"--dataset_path={synthetic}", f"--log_path={log}", *MODEL_FLAGS])
    return {**final_record(log), "log": str(log)}


@pytest.fixture(scope="module")
def reference_run(synthetic, tmp_path_factory):
    """One process at EQUIVALENCE_FLAGS: what the N-rank runs are compared with."""
    log = tmp_path_factory.mktemp("np1_reference") / "log.jsonl"
    run_python(["main.py", f"--dataset_path={synthetic}", f"--log_path={log}", *EQUIVALENCE_FLAGS])
    return final_record(log)


@pytest.fixture(scope="module")
def hot_rows_run(synthetic, tmp_path_factory) -> dict:
    """``-np 2`` with --hot_rows_budget=0.1, saving a checkpoint at the end: the log and checkpoints
    that the hot-rows tests below read (at EQUIVALENCE_FLAGS: the two ranks' AUC is compared with one
    process's after the same training)."""
    directory = tmp_path_factory.mktemp("hot_rows_np2")
    log, checkpoints = directory / "log.jsonl", directory / "checkpoints"
    launch(2, ["main.py", f"--dataset_path={synthetic}", f"--log_path={log}", "--hot_rows_budget=0.1",
               f"--save_checkpoint_path={checkpoints}", *EQUIVALENCE_FLAGS], timeout=600)
    return {"log": log, "checkpoints": checkpoints}


def test_training_reaches_the_oracle_auc(synthetic, single_process_run):
    oracle = yaml.safe_load(open(synthetic / "feature_spec.yaml"))["metadata"]["oracle_valid_auc"]
    assert single_process_run["auc"] >= oracle - 0.02, (single_process_run, oracle)


def test_final_log_line_follows_the_contract(single_process_run):
    assert set(single_process_run) - {"log"} == {"event", "auc", "logloss", "ne", "calibration", "positive_rate",
                                                 "train_samples_per_s", "steps", "world_size", "split", "selected_on",
                                                 "uncalibrated_logloss", "uncalibrated_ne", "uncalibrated_calibration",
                                                 "calibrated"}
    # The figures are the validation split's, at the last state: nothing chose it.
    assert (single_process_run["split"], single_process_run["selected_on"]) == ("validation", None)
    assert single_process_run["world_size"] == 1
    assert single_process_run["steps"] == 3 * (200_000 // 1024)
    assert single_process_run["train_samples_per_s"] > 0
    assert 0 < single_process_run["logloss"] < 0.69
    # NE is the logloss over the entropy of the positive rate (below 1: better than predicting the rate).
    rate = single_process_run["positive_rate"]
    entropy = -(rate * np.log(rate) + (1 - rate) * np.log(1 - rate))
    assert 0.05 < rate < 0.95
    assert abs(single_process_run["ne"] - single_process_run["logloss"] / entropy) <= 1e-12 and single_process_run["ne"] < 1
    # 0.62 before the calibration fitted on this split at the end (this SGD run predicts too few clicks), 1 after.
    assert 0.3 < single_process_run["uncalibrated_calibration"] < 3 and abs(single_process_run["calibration"] - 1) < 1e-3
    assert single_process_run["calibrated"]["method"] == "platt" and single_process_run["calibrated"]["split"] == "validation"
    evals = [json.loads(line) for line in open(single_process_run["log"], encoding="utf-8") if '"eval"' in line]
    assert evals and all({"auc", "logloss", "ne", "calibration", "positive_rate", "samples"} <= set(e) for e in evals)
    assert {k: evals[-1][k] for k in ("auc", "ne", "calibration", "positive_rate")} == {
        k: single_process_run[k if k in ("auc", "positive_rate") else f"uncalibrated_{k}"]
        for k in ("auc", "ne", "calibration", "positive_rate")}
    assert single_process_run["ne"] <= single_process_run["uncalibrated_ne"]


@pytest.mark.multirank
def test_two_ranks_end_with_the_same_auc_as_one(synthetic, reference_run, tmp_path):
    log = tmp_path / "log.jsonl"
    launch(2, ["main.py", f"--dataset_path={synthetic}", f"--log_path={log}", *EQUIVALENCE_FLAGS], timeout=600)
    two = final_record(log)
    assert two["world_size"] == 2
    assert two["steps"] == reference_run["steps"]
    assert abs(two["auc"] - reference_run["auc"]) <= 1e-3, (two, reference_run)
    config = json.loads(open(log).readline())
    assert config["event"] == "config" and len(config["rank_embedding_bytes"]) == 2
    assert config["alltoall_bytes_per_step"] > 0
    traffic = config["bytes_per_step_per_rank"]
    assert [t["rank"] for t in traffic] == [0, 1]
    assert max(t["alltoall_forward_sent"] for t in traffic) == config["alltoall_bytes_per_step"]
    assert traffic[0]["alltoall_forward_sent"] == traffic[1]["alltoall_forward_received"]
    assert traffic[0]["allreduce_payload"] > 0 and traffic[0]["allreduce_sent"] == traffic[0]["allreduce_payload"]
    events = [json.loads(line) for line in open(log)]
    (interaction,) = [e for e in events if e["event"] == "interaction"]
    assert interaction["training"] == interaction["evaluation"] == "kernel_fp32" and interaction["reasons"] == []


def write_nvidia_layout_by_hand(directory, num_samples: int, seed: int) -> None:
    """NVIDIA's split_binary layout written with plain numpy, independent of tf_dlrm's writer."""
    rng = np.random.default_rng(seed)
    cardinalities = [7, 3000, 100]
    weights = [rng.normal(0, 1.5, c) for c in cardinalities]
    for split, count in (("train", num_samples), ("test", num_samples // 4)):
        os.makedirs(directory / split)
        numerical = rng.random((count, 4)).astype(np.float16)
        ids = [rng.integers(0, c, count) for c in cardinalities]
        logit = sum(w[i] for w, i in zip(weights, ids)) + 2 * numerical[:, 0].astype(np.float64) - 1
        label = rng.random(count) < 1 / (1 + np.exp(-logit))
        label.astype(np.bool_).tofile(directory / split / "label.bin")
        numerical.tofile(directory / split / "numerical.bin")
        for index, (values, dtype) in enumerate(zip(ids, (np.int8, np.int16, np.int8))):
            values.astype(dtype).tofile(directory / split / f"cat_{index}.bin")
    features = {"label": {"dtype": "bool"}}
    features.update({f"num_{i}": {"dtype": "float16"} for i in range(4)})
    features.update({f"cat_{i}.bin": {"dtype": d, "cardinality": c} for i, (d, c) in enumerate(zip(("int8", "int16", "int8"), cardinalities))})
    sources = {
        split: [
            {"type": "split_binary", "features": [f"num_{i}" for i in range(4)], "files": [f"{split}/numerical.bin"]},
            {"type": "split_binary", "features": ["label"], "files": [f"{split}/label.bin"]},
        ] + [{"type": "split_binary", "features": [f"cat_{i}.bin"], "files": [f"{split}/cat_{i}.bin"]} for i in range(3)]
        for split in ("train", "test")
    }
    spec = {
        "feature_spec": features,
        "channel_spec": {"label": ["label"], "numerical": [f"num_{i}" for i in range(4)], "categorical": [f"cat_{i}.bin" for i in range(3)]},
        "source_spec": sources,
        "metadata": {},
    }
    (directory / "feature_spec.yaml").write_text(yaml.safe_dump(spec))


def test_dataset_written_by_an_independent_numpy_writer_trains(tmp_path):
    write_nvidia_layout_by_hand(tmp_path, 40_000, seed=3)
    log = tmp_path / "log.jsonl"
    run_python([
        "main.py", f"--dataset_path={tmp_path}", f"--log_path={log}", "--embedding_dim=8", "--bottom_mlp_dims=16,8",
        "--top_mlp_dims=16,1", "--batch_size=500", "--learning_rate=0.5", "--epochs=2", "--print_freq=40",
        "--optimizer=sgd", "--embedding_optimizer=sgd",
    ])
    final = final_record(log)
    assert final["steps"] == 2 * 80
    assert final["auc"] > 0.75, final  # labels depend strongly on the ids: a model that reads them learns


def test_adam_on_the_mlps_trains_with_its_own_learning_rate(synthetic, tmp_path):
    """Embedding SGD wants a rate near 1, Adam near 1e-3: one shared rate made Adam diverge."""
    flags = [f"--dataset_path={synthetic}", *[f for f in MODEL_FLAGS if not f.startswith("--epochs")], "--epochs=1", "--optimizer=adam",
             "--embedding_optimizer=sgd", "--embedding_learning_rate=0"]
    run_python(["main.py", *flags, "--dense_learning_rate=0.001", f"--log_path={tmp_path / 'own.jsonl'}"])
    diverged = run_python(["main.py", *flags, "--dense_learning_rate=0", f"--log_path={tmp_path / 'shared.jsonl'}"], check=False)
    own = final_record(tmp_path / "own.jsonl")
    assert own["auc"] >= 0.80, own
    # --learning_rate=1.0 for Adam too: the run diverges. Either its loss turns non-finite and the
    # run stops naming the step (issue #15), or it ends far below the oracle.
    if diverged.returncode == 0:
        assert final_record(tmp_path / "shared.jsonl")["auc"] < 0.6
    else:
        assert diverged.returncode == 2 and "training loss is" in diverged.stderr, diverged.stderr[-3000:]


@pytest.mark.multirank
def test_printed_loss_is_the_mean_over_ranks(synthetic, tmp_path):
    """Three steps, a progress line each: ``-np 2`` prints the loss of the global batch, equal to one
    process's up to float summation order (a few roundoffs of a loss ~0.7: 1e-5 is ample), while
    rank 0's own half batch differs by its sampling noise (~0.5 / sqrt(512) ~ 0.02)."""
    flags = [f"--dataset_path={synthetic}", *MODEL_FLAGS, "--max_steps=3", "--print_freq=1", "--embedding_optimizer=lazy_adam",
             "--embedding_learning_rate=0.01", "--optimizer=lamb", "--dense_learning_rate=0.01"]
    run_python(["main.py", *flags, f"--log_path={tmp_path / 'one.jsonl'}"])
    launch(2, ["main.py", *flags, f"--log_path={tmp_path / 'two.jsonl'}"], timeout=600)
    one, two = train_losses(tmp_path / "one.jsonl"), train_losses(tmp_path / "two.jsonl")
    assert sorted(one) == sorted(two) == [1, 2, 3]
    for step in one:
        assert abs(one[step] - two[step]) <= 1e-5, (step, one, two)


def test_flag_errors_are_clear(synthetic, tmp_path):
    bad = run_python(["main.py", f"--dataset_path={synthetic}", "--bottom_mlp_dims=64,8", "--embedding_dim=16"], check=False)
    assert bad.returncode != 0
    assert "--bottom_mlp_dims=64,8" in bad.stderr and "--embedding_dim=16" in bad.stderr
    missing = run_python(["main.py", f"--dataset_path={tmp_path}"], check=False)
    assert missing.returncode != 0 and "feature_spec.yaml" in missing.stderr
    unknown = run_python(["main.py", f"--dataset_path={synthetic}", "--embedding_optimizer=adam"], check=False)
    assert unknown.returncode != 0 and "embedding_optimizer" in unknown.stderr


def parse_flags(argv: list[str]):
    """main.py's flags parsed in this process into its RunConfig, as main.py parses them first (a
    ValueError raised here is what main.py prints as its one error line, with exit code 2: the
    refusals run through main.py above and in tests/bad_inputs show that path)."""
    from tf_dlrm.cli import main as cli  # defines main.py's flags on absl's FLAGS
    from tf_dlrm.cli.flags import config_from_flags

    cli.FLAGS.unparse_flags()
    try:
        cli.FLAGS(["main.py", "--dataset_path=/nowhere", *argv])
        return config_from_flags(cli.FLAGS)
    finally:
        cli.FLAGS.unparse_flags()  # the next test that parses starts from the defaults


def test_flag_value_errors_name_the_flag():
    with pytest.raises(ValueError, match="dense_learning_rate=-0.1"):
        parse_flags(["--dense_learning_rate=-0.1"])
    with pytest.raises(ValueError, match="beta_1=1.5") as beta:
        parse_flags(["--embedding_optimizer=lazy_adam", "--adam_beta1=1.5"])
    assert "--adam_beta1" in str(beta.value)


@pytest.mark.multirank
def test_batch_size_not_divisible_by_ranks_fails_before_any_work(synthetic, tmp_path):
    log = tmp_path / "log.jsonl"
    result = launch(2, ["main.py", f"--dataset_path={synthetic}", "--batch_size=1001", f"--log_path={log}"], check=False, timeout=300)
    assert result.returncode != 0
    assert "--batch_size=1001 does not divide by the number of ranks (2)" in result.stdout + result.stderr
    assert not log.exists(), "work started before the batch size was checked"


def test_in_memory_synthetic_batches_and_tensorboard(tmp_path):
    log, board = tmp_path / "log.jsonl", tmp_path / "board"
    run_python([
        "main.py", "--dataset_type=synthetic", f"--feature_spec={REPO}/feature_specs/synthetic_small.yaml",
        "--embedding_dim=8", "--bottom_mlp_dims=16,8", "--top_mlp_dims=16,1", "--batch_size=256", "--max_steps=30",
        "--print_freq=10", f"--log_path={log}", f"--tensorboard_dir={board}",
    ])
    final = final_record(log)
    assert final["steps"] == 30 and final["auc"] is None  # no validation split in a data-less spec
    events = [json.loads(line) for line in open(log, encoding="utf-8")]
    assert [e["step"] for e in events if e["event"] == "train"] == [10, 20, 30]
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(board))


@pytest.mark.multirank
def test_deduplicated_exchange_trains_the_same_model(synthetic, reference_run, tmp_path):
    """--deduplicate_exchange changes only the bytes of the exchange (and the order of float32 sums)."""
    log = tmp_path / "log.jsonl"
    launch(2, ["main.py", f"--dataset_path={synthetic}", f"--log_path={log}", "--deduplicate_exchange", *EQUIVALENCE_FLAGS], timeout=600)
    two = final_record(log)
    assert two["world_size"] == 2 and two["steps"] == reference_run["steps"]
    assert abs(two["auc"] - reference_run["auc"]) <= 1e-3, (two, reference_run)
    config = json.loads(open(log).readline())
    assert config["deduplicate_exchange"] is True


def test_deduplicated_exchange_refusals_name_the_flag(synthetic, tmp_path):
    deepfm_flags = [f for f in MODEL_FLAGS if not f.startswith(("--bottom_mlp_dims", "--top_mlp_dims"))]  # DLRM's own
    done = run_python(["main.py", f"--dataset_path={synthetic}", "--deduplicate_exchange", "--model=deepfm", *deepfm_flags],
                      check=False)
    assert done.returncode != 0
    assert "--deduplicate_exchange is implemented for models that read the spec's columns as they are" in done.stderr, done.stderr[-2000:]


@pytest.mark.multirank
def test_hot_rows_train_the_same_model_with_fewer_bytes(synthetic, reference_run, hot_rows_run):
    """--hot_rows_budget: id counts written next to the data, the plan logged, the same model as one
    process, and the measured forward bytes below the plain exchange's."""
    log = hot_rows_run["log"]
    two = final_record(log)
    assert two["world_size"] == 2 and two["steps"] == reference_run["steps"]
    assert abs(two["auc"] - reference_run["auc"]) <= 1e-3, (two, reference_run)
    assert (synthetic / "id_counts.npz").exists() or any(synthetic.rglob("id_counts.npz"))
    events = [json.loads(line) for line in open(log)]
    (plan,) = [e for e in events if e["event"] == "hot_rows"]
    assert plan["hot_bytes"] <= plan["budget_bytes"] and plan["tables"] and plan["expected_hit_rate"] > 0.3
    (measured,) = [e for e in events if e["event"] == "hot_rows_measured"]
    for rank in measured["ranks"]:
        assert rank["lookups"] > 0 and 0.3 < rank["hit_rate"] <= 1
        assert rank["sent_ratio"] < 0.8, rank
    assert 0 < measured["exchanged_bytes_ratio"] < 0.8, measured


def test_bad_hot_rows_budget_names_the_flag():
    with pytest.raises(ValueError, match="--hot_rows_budget"):
        parse_flags(["--hot_rows_budget=1.5", *MODEL_FLAGS])


@pytest.mark.multirank
def test_checkpoint_with_hot_rows_restores_without_them(synthetic, hot_rows_run, tmp_path):
    """The replicas are the model's values of hot rows: a checkpoint saved with hot rows at 2 ranks and
    evaluated by one process (no hot rows) gives the AUC the 2 ranks measured at the end."""
    trained = final_record(hot_rows_run["log"])
    evaluated_log = tmp_path / "eval.jsonl"
    run_python(["main.py", f"--dataset_path={synthetic}", f"--log_path={evaluated_log}", "--mode=eval",
                f"--restore_checkpoint_path={hot_rows_run['checkpoints']}", *EQUIVALENCE_FLAGS])
    evaluated = final_record(evaluated_log)
    assert evaluated["auc"] == pytest.approx(trained["auc"], abs=1e-6), (evaluated, trained)
    assert trained["auc"] > 0.7
