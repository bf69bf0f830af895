"""benchmarks/roofline.py: the FLOPs and bytes it counts from a built model equal a hand count, and the
fractions it prints follow from the figures printed beside them."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

import pytest

from conftest import run_python

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import roofline  # noqa: E402
from train_throughput import CONFIGS, build_tf_dlrm  # noqa: E402

TINY = CONFIGS["tiny"]  # synthetic_small: 13 numerical features, 8 one-hot tables; width 8, bottom 16-8, top 16-1


def tiny_cost(config, compute_bytes=4):
    from tf_dlrm.parallel.env import DistributedEnv
    from tf_dlrm.spec.feature_spec import FeatureSpec

    spec = FeatureSpec.load(str(ROOT / config.feature_spec), check_files=False)
    model = build_tf_dlrm(config, spec, DistributedEnv(), seed=1)
    return roofline.model_cost(model, spec, config.embedding_dim, compute_bytes)


def test_dlrm_flops_and_bytes_equal_the_hand_count():
    cost = tiny_cost(TINY)
    pairs = 9 * 8 // 2  # the bottom MLP's output and 8 embeddings, strict lower triangle
    assert sorted(cost.matmul_shapes) == sorted([(13, 16), (16, 8), (8 + pairs, 16), (16, 1)])
    assert cost.dense_macs == 13 * 16 + 16 * 8 + 44 * 16 + 16 * 1
    assert cost.interaction_macs == pairs * 8
    assert cost.flops_per_sample == 3 * 2 * (1056 + 288)
    # 8 one-hot tables of width 8, float32: a row read and a pooled vector written per table; the pooled
    # vectors and their gradients exchanged; a gradient and a row read and the row written per id.
    assert (cost.gather_bytes, cost.exchange_bytes, cost.update_bytes) == (8 * 8 * 4 * 2, 2 * 8 * 8 * 4, 3 * 8 * 8 * 4)
    assert tiny_cost(TINY, compute_bytes=2).exchange_bytes == 2 * 8 * 8 * 2


def test_dcnv2_counts_each_cross_matrix_and_no_interaction():
    params = (("num_cross_layers", 2), ("cross_low_rank", 4), ("deep_mlp_dims", (16,)))
    cost = tiny_cost(dataclasses.replace(TINY, model="dcnv2", params=params))
    width = 13 + 8 * 8  # x0: the raw numerical features and the embeddings
    assert sorted(cost.matmul_shapes) == sorted([(width, 4), (4, width)] * 2 + [(width, 16), (16, 1)])
    assert cost.interaction_macs == 0


def test_printed_fractions_follow_from_the_printed_figures(tmp_path):
    table = tmp_path / "roofline.md"
    done = run_python(["benchmarks/roofline.py", "--configs=tiny", "--batch_sizes=256", "--windows=2", "--window_steps=2",
                       "--matmul_repeats=1", "--stream_elements=1000000", f"--work_dir={tmp_path}", f"--markdown={table}"])
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [(r["config"], r["batch_size"], r["precision"]) for r in records] == [("tiny", 256, "fp32"), ("tiny", 256, "bf16")]
    for r in records:
        assert r["flops_per_sample"] == 3 * 2 * (r["dense_macs_per_sample"] + r["interaction_macs_per_sample"])
        rounding = 5e-4 / r["matmul_gflops_per_s"] + 0.05 / r["compute_roofline_samples_per_s"]  # of the printed figures
        assert r["compute_roofline_samples_per_s"] == pytest.approx(r["matmul_gflops_per_s"] * 1e9 / r["flops_per_sample"], rel=rounding)
        # The printed fraction is rounded to 5e-4, and the figures it is recomputed from by up to `rounding`
        # relative: the bound is their sum (pytest.approx takes the larger of rel and abs, not the sum).
        expected = r["samples_per_s"] * r["flops_per_sample"] / (r["matmul_gflops_per_s"] * 1e9)
        assert abs(r["compute_fraction"] - expected) <= 5e-4 + expected * (rounding + 0.05 / r["samples_per_s"]), (r, expected)
        bandwidth = r["bandwidth_gb_per_s"]["copy"] * 1e9
        assert r["bytes_per_sample"]["total"] == sum(r["bytes_per_sample"][k] for k in ("gather", "exchange", "update"))
        expected = r["samples_per_s"] * r["bytes_per_sample"]["total"] / bandwidth
        assert abs(r["memory_fraction"] - expected) <= 5e-4 + expected * (0.005 / r["bandwidth_gb_per_s"]["copy"]
                                                                          + 0.05 / r["samples_per_s"]), (r, expected)
    rows = [line for line in table.read_text().splitlines() if line.startswith("| tiny |")]
    assert len(rows) == 2 and f"{records[0]['compute_fraction']:.2f}" in rows[0]
