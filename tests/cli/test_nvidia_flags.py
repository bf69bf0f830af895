"""NVIDIA's command lines (DeepLearningExamples' TF2 DLRM): each DLE flag means what it means in DLE,
or the run is refused in one line naming the flag and what to use (tf_dlrm.cli.nvidia_flags)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import make_synthetic_small, own_lines, run_python

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC = os.path.join(REPO, "feature_specs", "synthetic_small.yaml")

# One interpreter parses every command line (absl's flags are defined once per process).
PARSE_MANY = """
import json, sys
from absl import flags
import tf_dlrm.cli.flags as run_flags
from tf_dlrm.cli import builder
from tf_dlrm.spec.feature_spec import FeatureSpec

run_flags.define_flags()
spec = FeatureSpec.load(sys.argv[1], check_files=False)
results = {}
for key, argv in json.loads(sys.argv[2]).items():
    flags.FLAGS.unparse_flags()
    try:
        flags.FLAGS(["main.py", "--dataset_path=/nowhere", *argv])
        config = run_flags.config_from_flags(flags.FLAGS)
        opt = config.optimizer
        plan = builder.make_sharding_plan(spec, config.model, config.sharding, 2)
        results[key] = {
            "dense": opt.optimizer, "embedding": opt.embedding_optimizer, "base": opt.schedule.base,
            "dense_rate": opt.schedule.base * opt.dense_rate_factor,
            "embedding_rate": opt.schedule.base * opt.embedding_rate_factor,
            "betas": [opt.adam_beta1, opt.adam_beta2], "strategy": config.sharding.strategy,
            "widths": [t.embedding_dim for t in builder.model_tables(spec, config.model)],
            "replicated": [plan.tables[t].name for t in plan.replicated],
            "params": {k: v for k, v in vars(config.model.params).items()},
            "notes": list(config.notes), "inference_batch_sizes": list(config.inference_batch_sizes),
            "model": config.model.name, "cpu": config.cpu,
        }
    except (ValueError, flags.Error) as error:
        results[key] = {"error": str(error)}
print(json.dumps(results))
"""

TABLES = ["cat_0.bin", "cat_1.bin", "cat_2.bin", "cat_3.bin", "cat_4.bin", "cat_5.bin", "cat_6.bin", "cat_7.bin"]
ROWS = [3, 16, 120, 600, 1500, 2048, 3500, 5000]

CASES = {
    "tf_dlrm_defaults": [],
    # DLE dlrm.py's defaults, written out: SGD on the MLPs and the tables at 24.
    "sgd_24": ["--optimizer", "sgd", "--learning_rate", "24"],
    "sgd_own_embedding_optimizer": ["--optimizer", "sgd", "--embedding_optimizer", "adagrad", "--learning_rate", "24"],
    "adam_betas": ["--optimizer", "adam", "--learning_rate", "0.0001", "--beta1", "0.8", "--beta2", "0.99"],
    "beta_conflict": ["--beta1", "0.8", "--adam_beta1", "0.7"],
    "dims_list": ["--embedding_dim", "4,4,8,8,16,16,32,32", "--interaction", "cat"],
    "dims_one": ["--embedding_dim", "16", "--bottom_mlp_dims", "32,16"],
    "dims_wrong_count": ["--embedding_dim", "4,8"],
    "dle_values": ["--interaction", "dot_custom_cuda", "--dist_strategy", "memory_balanced"],
    "dot_tensorflow": ["--interaction", "dot_tensorflow", "--dist_strategy", "basic"],
    # 600 x 128 = 76,800 elements: cat_0..cat_3 (3, 16, 120, 600 rows at width 128) are under 100,000.
    "elements": ["--data_parallel_threshold", "100000"],
    "elements_and_rows": ["--data_parallel_threshold", "100000", "--data_parallel_rows", "2000"],
    "no_effect": ["--use_mde_embeddings", "--concat_embedding", "--auc_thresholds", "8000", "--embedding_trainable"],
    "inference": ["--mode", "inference", "--valid_batch_size", "512"],
    "projection": ["--model", "dcnv2", "--cross_layer_projection_dim", "64"],
    "interaction_cross": ["--interaction", "cross", "--cross_layer_projection_dim", "64"],
    "columnwise_split": ["--columnwise_split"],
    "dot_interaction_22_06": ["--dot_interaction", "tensorflow"],
    "nofp16": ["--nofp16"],
    "cpu": ["--cpu"],
    # Refused with one line each.
    "frozen": ["--noembedding_trainable"],
    "projection_dlrm": ["--cross_layer_projection_dim", "512"],
    "dot_interaction_dummy": ["--dot_interaction", "dummy"],
}
from tf_dlrm.cli.nvidia_flags import REFUSED, _SWITCHES  # noqa: E402  (the flags the tests below refuse one by one)

for _name in REFUSED:
    CASES[f"refused_{_name}"] = [f"--{_name}"] if _name in _SWITCHES else [f"--{_name}", "5"]


@pytest.fixture(scope="module")
def parsed(tmp_path_factory):
    widths = tmp_path_factory.mktemp("dims") / "embedding_dims.json"  # DLE also reads the list from a JSON file
    widths.write_text(json.dumps([4, 4, 8, 8, 16, 16, 32, 32]))
    cases = {**CASES, "dims_file": ["--embedding_dim", str(widths), "--interaction", "cat"]}
    completed = subprocess.run([sys.executable, "-c", PARSE_MANY, SPEC, json.dumps(cases)], cwd=REPO, capture_output=True,
                               text=True, timeout=300, env={**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_tf_dlrm_defaults_stay_when_no_nvidia_flag_is_given(parsed):
    r = parsed["tf_dlrm_defaults"]
    # Catch-up Adam on the tables by default (benchmarks/results/quality_real.md); NVIDIA's --optimizer=adam
    # still means lazy Adam on them (below).
    assert (r["dense"], r["embedding"]) == ("adam", "catch_up_adam")
    assert r["dense_rate"] == pytest.approx(0.001) and r["embedding_rate"] == pytest.approx(0.003)
    assert r["replicated"] == [t for t, rows in zip(TABLES, ROWS) if rows < 2048]  # the row rule
    assert r["notes"] == []


def test_optimizer_sgd_trains_the_tables_with_sgd_at_the_learning_rate(parsed):
    r = parsed["sgd_24"]
    assert (r["dense"], r["embedding"]) == ("sgd", "sgd")
    assert r["dense_rate"] == 24 and r["embedding_rate"] == 24
    # --embedding_optimizer given keeps its own choice.
    assert parsed["sgd_own_embedding_optimizer"]["embedding"] == "adagrad"


def test_optimizer_adam_is_lazy_adam_on_the_tables_with_nvidia_betas(parsed):
    r = parsed["adam_betas"]
    assert (r["dense"], r["embedding"]) == ("adam", "lazy_adam")
    assert r["dense_rate"] == r["embedding_rate"] == pytest.approx(0.0001)
    assert r["betas"] == pytest.approx([0.8, 0.99])
    assert "--beta1 is NVIDIA's name of --adam_beta1" in parsed["beta_conflict"]["error"]


def test_embedding_dim_list_gives_each_table_its_width_in_spec_order(parsed):
    assert parsed["dims_list"]["widths"] == [4, 4, 8, 8, 16, 16, 32, 32]
    assert parsed["dims_file"]["widths"] == [4, 4, 8, 8, 16, 16, 32, 32]
    assert parsed["dims_one"]["widths"] == [16] * 8
    assert parsed["dims_wrong_count"]["error"] == ("Expected --embedding_dim to list one width per categorical feature "
                                                   "of the spec (8). Received: 2 widths")


def test_nvidia_value_spellings(parsed):
    for key in ("dle_values", "dot_tensorflow"):
        assert parsed[key]["params"]["interaction"] == "dot"
        assert parsed[key]["strategy"] == "auto"
    assert parsed["columnwise_split"]["strategy"] == "column_wise"
    assert parsed["dot_interaction_22_06"]["params"]["interaction"] == "dot"


def test_data_parallel_threshold_counts_elements_as_nvidia(parsed):
    # Width 128 (the default): replicated are the tables of fewer than 100,000 elements, not of fewer than 2048 rows.
    assert parsed["elements"]["replicated"] == [t for t, rows in zip(TABLES, ROWS) if rows * 128 < 100_000]
    assert parsed["elements"]["replicated"] == TABLES[:4]
    # With tf_dlrm's row rule given as well, both rules replicate.
    assert parsed["elements_and_rows"]["replicated"] == TABLES[:5]


def test_implementation_flags_are_accepted_with_a_note(parsed):
    notes = parsed["no_effect"]["notes"]
    assert any(n.startswith("--use_mde_embeddings accepted with no effect") for n in notes)
    assert any(n.startswith("--concat_embedding accepted with no effect") for n in notes)
    assert "--auc_thresholds ignored: tf_dlrm computes the exact AUC (no threshold buckets)" in notes
    assert parsed["nofp16"]["notes"] == []  # NVIDIA's default, asked for: nothing to refuse


def test_cpu_hides_the_gpus(parsed):
    # --cpu is tf_dlrm's own flag too (tf_dlrm.parallel.devices hides the GPUs); a DLE line with it parses.
    assert parsed["cpu"]["cpu"] is True and parsed["tf_dlrm_defaults"]["cpu"] is False


def test_inference_times_the_validation_batch_size(parsed):
    assert parsed["inference"]["inference_batch_sizes"] == [512]


def test_cross_layer_projection_dim_is_the_cross_rank(parsed):
    assert parsed["projection"]["model"] == "dcnv2"
    assert parsed["projection"]["params"]["cross_low_rank"] == 64
    # NVIDIA's DCNv2: DLRM with cross layers over the bottom MLP's output and the embeddings.
    cross = parsed["interaction_cross"]
    assert cross["model"] == "dlrm" and cross["params"]["interaction"] == "cross"
    assert (cross["params"]["num_cross_layers"], cross["params"]["cross_low_rank"]) == (3, 64)


@pytest.mark.parametrize("key, expected", [
    ("frozen", "--noembedding_trainable (NVIDIA's frozen tables) is not supported"),
    ("projection_dlrm", "--cross_layer_projection_dim applies to cross layers: use --interaction=cross (NVIDIA's DCNv2) "
                        "or --model=dcnv2"),
    ("dot_interaction_dummy", "Expected --dot_interaction (NVIDIA 22.06) to be custom_cuda or tensorflow"),
])
def test_refused_values(parsed, key, expected):
    error = parsed[key]["error"]
    assert error.startswith(expected) and "\n" not in error


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_flag(parsed, name):
    error = parsed[f"refused_{name}"]["error"]
    assert error == f"--{name} (NVIDIA's flag) is not supported: {REFUSED[name]}"


def dllogger_records(path):
    """What a user's script does with DLE's log: json after the 'DLLL ' prefix."""
    records = []
    with open(path) as handle:
        for line in handle:
            if line.startswith("DLLL "):
                records.append(json.loads(line[len("DLLL "):]))
    return records


def test_nvidia_readme_command_lines_train_what_they_mean(tmp_path):
    """DLE's README lines as written, ``dlrm.py`` included (tf_dlrm's ``dlrm.py``: main.py with NVIDIA dlrm.py's
    defaults), with the launcher's ``numactl --interleave=all --`` dropped: the multi-GPU quick start
    (``horovodrun -np 8 ... python -u dlrm.py --dataset_path ... --amp --xla --save_checkpoint_path ...``, here on
    2 ranks) with small widths and a DLLogger log trains SGD at dlrm.py's rate 24 on the tables too (no optimizer
    flag on the line: the script's defaults); the evaluation line (``... --restore_checkpoint_path <path> --mode
    eval``) and the inference line (``... --restore_checkpoint_path <path> --mode inference``) write DLE's records."""
    from tests.conftest import launch

    data = make_synthetic_small(tmp_path / "data", seed=3, num_train=2048, num_valid=1024)
    checkpoints, log = tmp_path / "checkpoint", tmp_path / "dlrm_tf_log.json"
    model = ["--embedding_dim", "8", "--bottom_mlp_dims", "16,8", "--top_mlp_dims", "16,1", "--batch_size", "512",
             "--valid_batch_size", "512"]
    launch(2, ["-u", "dlrm.py", "--dataset_path", str(data), "--amp", "--xla", "--save_checkpoint_path", str(checkpoints),
               "--warmup_steps", "100", *model,
               "--max_steps", "3", "--auc_thresholds", "8000", "--log_path", str(log), "--log_format", "dllogger"])
    [checkpoint] = glob.glob(str(checkpoints / "ckpt-*"))
    with open(os.path.join(checkpoint, "manifest.json")) as handle:
        optimizer = json.load(handle)["optimizer"]
    assert (optimizer["name"], optimizer["embedding_optimizer"]) == ("sgd", "sgd")
    assert optimizer["schedule"]["base"] == 24 and optimizer["embedding_learning_rate"] in (0, 24)
    # SGD at rates 0.24, 0.48, 0.72 (warmup) moves the tables by rate x gradient, far below the init bound
    # plus one; lazy Adam would move every touched value by about the rate each step (0.24 + 0.48 + 0.72).
    tables = [np.load(f) for f in glob.glob(os.path.join(checkpoint, "tables", "**", "*.npy"), recursive=True)]
    assert tables and max(float(np.abs(t).max()) for t in tables) < 0.5
    assert not glob.glob(os.path.join(checkpoint, "optimizer", "*embedding*"))  # SGD keeps no state for the rows

    records = dllogger_records(log)
    assert records[0]["type"] == "LOG" and records[0]["step"] == "PARAMETER"
    assert records[0]["data"]["optimizer"] == "sgd" and records[0]["data"]["learning_rate"] == 24
    [final] = [r for r in records if r["step"] == []]
    assert set(final["data"]) == {"throughput", "mean_step_time_ms", "auc", "validation_loss"}
    assert 0 < final["data"]["auc"] < 1 and final["data"]["validation_loss"] > 0
    assert final["data"]["throughput"] > 0
    assert final["data"]["mean_step_time_ms"] == pytest.approx(512 / final["data"]["throughput"] * 1e3)
    for record in records:
        assert {"timestamp", "datetime", "elapsedtime", "type", "step", "data"} <= set(record)

    evaluated, timed = tmp_path / "eval_log.json", tmp_path / "inference_log.json"
    run_python(["-u", "dlrm.py", "--dataset_path", str(data), "--amp", "--xla", *model, "--restore_checkpoint_path",
                str(checkpoints), "--mode", "eval", "--log_path", str(evaluated), "--log_format", "dllogger"])
    [final] = [r for r in dllogger_records(evaluated) if r["step"] == []]
    assert set(final["data"]) == {"auc", "test_loss"} and 0 < final["data"]["auc"] < 1 and final["data"]["test_loss"] > 0
    run_python(["-u", "dlrm.py", "--dataset_path", str(data), "--amp", *model, "--restore_checkpoint_path",
                str(checkpoints), "--mode", "inference", "--max_steps", "5", "--log_path", str(timed), "--log_format", "dllogger"])
    [final] = [r for r in dllogger_records(timed) if r["step"] == []]
    figures = final["data"]
    assert figures["batch_size"] == 512  # NVIDIA's inference times --valid_batch_size
    assert 0 < figures["mean_inference_latency"] <= figures["p99_inference_latency"]
    assert figures["p90_inference_latency"] <= figures["p95_inference_latency"] <= figures["p99_inference_latency"]
    assert figures["mean_inference_throughput"] == pytest.approx(512 / figures["mean_inference_latency"])


def test_refused_flag_stops_main_before_any_work(tmp_path):
    log = tmp_path / "log.json"
    completed = run_python(["main.py", "--dataset_path", str(tmp_path), "--cpu_offloading_threshold_gb", "10",
                            "--log_path", str(log)], check=False)
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines()[-1] == (
        f"error (rank 0): --cpu_offloading_threshold_gb (NVIDIA's flag) is not supported: {REFUSED['cpu_offloading_threshold_gb']}")
    assert not log.exists()


def test_nvidia_dcnv2_script_line_trains_nvidias_dcnv2(tmp_path):
    """DLE's DCNv2 quick start (``python -u dcnv2.py --dataset_path ... --amp --xla --save_checkpoint_path ...``)
    trains NVIDIA's DCNv2: its defaults (``--interaction cross``, 3 cross layers of rank 512 over the bottom MLP's
    output and 128-wide embeddings, Adam at 1e-4) with a batch this machine's test holds."""
    data = tmp_path / "data"
    make_synthetic_small(data, seed=1, num_train=16384, num_valid=4096)
    checkpoints, log = tmp_path / "checkpoint", tmp_path / "log.jsonl"
    run_python(["-u", "dcnv2.py", "--dataset_path", str(data), "--amp", "--xla", "--save_checkpoint_path", str(checkpoints),
                "--batch_size", "4096", "--valid_batch_size", "4096", "--log_path", str(log)], timeout=600)
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert next(e for e in events if e["event"] == "interaction")["training"] == "CrossInteraction"
    final = events[-1]
    assert final["event"] == "final" and final["steps"] == 4 and 0.0 <= final["auc"] <= 1.0
    (saved,) = glob.glob(str(checkpoints / "ckpt-*"))
    with open(os.path.join(saved, "manifest.json")) as handle:
        model = json.load(handle)["model"]
    assert (model["name"], model["embedding_dim"]) == ("dlrm", 128)
    assert {k: model["config"][k] for k in ("interaction", "num_cross_layers", "cross_low_rank", "bottom_mlp_dims")} == {
        "interaction": "cross", "num_cross_layers": 3, "cross_low_rank": 512, "bottom_mlp_dims": [512, 256, 128]}


def test_nvidia_scripts_put_their_defaults_before_the_line():
    """The line's own flags come last, so they override the script's defaults (absl keeps a flag's last value)."""
    from tf_dlrm.cli.nvidia_scripts import script_argv

    argv = script_argv("dlrm.py", ["dlrm.py", "--learning_rate", "3", "--mode", "eval"])
    assert argv[0] == "dlrm.py" and argv[-4:] == ["--learning_rate", "3", "--mode", "eval"]
    assert argv[argv.index("--learning_rate") + 1] == "24" and argv[argv.index("--optimizer") + 1] == "sgd"
    dcnv2 = script_argv("dcnv2.py", ["dcnv2.py"])
    assert dcnv2[dcnv2.index("--optimizer") + 1] == "adam" and dcnv2[dcnv2.index("--learning_rate") + 1] == "0.0001"


def test_a_line_overriding_a_script_default_is_not_a_flag_given_twice():
    """dlrm.py puts its --warmup_steps 8000 ahead of the line: the line's --warmup_steps 100 overrides it (NVIDIA's
    meaning), while the same flag twice on the line itself is still refused."""
    from absl import flags as absl_flags

    from tf_dlrm.cli.flags import define_flags, refuse_repeated_flags
    from tf_dlrm.cli.nvidia_scripts import script_argv, user_argv

    values = absl_flags.FlagValues()
    define_flags(flag_values=values)
    argv = script_argv("dlrm.py", ["dlrm.py", "--warmup_steps", "100"])
    assert argv.count("--warmup_steps") == 2
    refuse_repeated_flags(user_argv(argv), values)
    twice = script_argv("dlrm.py", ["dlrm.py", "--warmup_steps", "100", "--warmup_steps=5"])
    with pytest.raises(ValueError, match="--warmup_steps is given twice"):
        refuse_repeated_flags(user_argv(twice), values)
    assert user_argv(["main.py", "--embedding_dim=4"]) == ["main.py", "--embedding_dim=4"]
