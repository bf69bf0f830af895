"""benchmarks/scaling_model.py: pure Python (no TensorFlow), hand-checked FLOPs, parameters, bytes
and Zipf fits, and a prediction that follows its rates."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPOSITORY, "benchmarks"))

import scaling_model  # noqa: E402


def test_mlperf_dense_model_hand_computed():
    dense = scaling_model.DenseModel(tables=26, dim=128)
    assert dense.interaction_width == 128 + 27 * 26 // 2 == 479  # MLPerf's top MLP input
    bottom = 13 * 512 + 512 + 512 * 256 + 256 + 256 * 128 + 128
    top = 479 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 512 + 512 + 512 * 256 + 256 + 256 + 1
    assert dense.parameters == bottom + top
    mlp = 2 * (13 * 512 + 512 * 256 + 256 * 128 + 479 * 1024 + 1024 * 1024 + 1024 * 512 + 512 * 256 + 256)
    assert dense.flops_per_sample() == 3 * mlp + 3 * 27 * 27 * 128


def test_plan_figures_bytes_follow_the_plan():
    figures = scaling_model.plan_figures(scaling_model.mlperf_shape(), 8, 32768)
    assert sum(figures["rank_bytes"]) >= figures["plan"].total_bytes()  # replicated tables counted on every rank
    sent = [t.alltoall_forward_sent for t in figures["traffic"]]
    received = [t.alltoall_forward_received for t in figures["traffic"]]
    assert sum(sent) == sum(received) > 0
    assert figures["traffic"][0].allreduce_sent == 2 * 7 * figures["traffic"][0].allreduce_payload // 8


def test_prediction_is_the_sum_of_its_parts():
    rates = {"dense_flop_per_s": 1e11, "alltoall_bytes_per_s": 1e9, "allreduce_bytes_per_s": 1e9, "seconds_per_gathered_value": 1e-9}
    prediction = scaling_model.predict(scaling_model.config_shape("criteo_capped"), 2, 16384, rates)
    step = prediction["slowest_rank"]
    parts = step["dense_s"] + step["embedding_s"] + step["exchange_s"] + step["allreduce_s"]
    assert math.isclose(step["step_s"], parts, rel_tol=1e-3)
    assert math.isclose(prediction["samples_per_s"], 16384 / step["step_s"], rel_tol=1e-3)
    dense = scaling_model.DenseModel(26, 128).flops_per_sample() * 8192 / 1e11
    assert math.isclose(step["dense_s"], dense, rel_tol=1e-3)


def test_a_link_adds_its_bytes_and_latency_and_shared_cores_slow_compute():
    rates = {"dense_flop_per_s": 1e11, "alltoall_bytes_per_s": 1e9, "allreduce_bytes_per_s": 1e9,
             "seconds_per_gathered_value": 1e-9, "calibrated_on": {"world_size": 2}}
    shape = scaling_model.config_shape("criteo_capped")
    alone = scaling_model.predict(shape, 4, 4096, rates)
    linked = scaling_model.predict(shape, 4, 4096, rates, link=scaling_model.Link(800, 10), cores=2)
    traffic = max(linked["figures"]["traffic"], key=lambda t: t.alltoall_forward_sent + t.alltoall_backward_sent)
    rank = linked["figures"]["traffic"].index(traffic)
    alone_rank = scaling_model.predict(shape, 4, 4096, rates)["figures"]["traffic"][rank]
    assert alone_rank.allreduce_sent == traffic.allreduce_sent
    # 800 Mbit/s is 1e8 bytes/s; 6 messages of 10 us per collective on 4 ranks.
    allreduce_link = traffic.allreduce_sent / 1e8 + 6 * 10e-6
    assert math.isclose(linked["slowest_rank"]["allreduce_s"], alone["slowest_rank"]["allreduce_s"] + allreduce_link, rel_tol=1e-3)
    # 4 ranks on 2 cores against a calibration of 2 ranks on 2: twice the compute.
    assert math.isclose(linked["slowest_rank"]["dense_s"], 2 * alone["slowest_rank"]["dense_s"], rel_tol=1e-3)
    with pytest.raises(ValueError, match="bandwidth_mbit > 0"):
        scaling_model.Link(0)


def test_zipf_fit_recovers_an_exact_power_law(tmp_path):
    # Id k (1-based) appears round(1000 / k) times in feature 0: an exponent of 1.
    lines = []
    for k in range(1, 41):
        lines += [f"0\t" + "\t" * 13 + f"id{k}" + "\t" * 25] * round(1000 / k)
    path = tmp_path / "sample.tsv"
    path.write_text("\n".join(lines) + "\n")
    exponents = scaling_model.zipf_exponents(str(path))
    assert exponents["cat_0"] == pytest.approx(1.0, abs=0.01)
    assert exponents["cat_1"] is None  # no ids


def test_the_model_imports_no_tensorflow():
    code = "import sys; sys.path.insert(0, 'benchmarks'); import scaling_model; print('tensorflow' in sys.modules, 'horovod' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPOSITORY, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]


def test_rates_from_a_breakdown_record(tmp_path):
    figures = scaling_model.plan_figures(scaling_model.config_shape("criteo_capped"), 2, 4096)
    records = []
    for rank, traffic in enumerate(figures["traffic"]):
        records.append({"benchmark": "step_breakdown", "mode": "horovod", "rank": rank, "world_size": 2, "global_batch_size": 4096,
                        "ms": {"dense_forward_backward": 1000.0, "exchange": 100.0, "allreduce": 10.0, "lookup": 5.0, "update": 5.0},
                        "bytes_per_step": traffic.to_dict()})
    path = tmp_path / "breakdown.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records))
    rates = scaling_model.rates_from_breakdown(scaling_model.read_jsonl(str(path)))
    assert rates["dense_flop_per_s"] == pytest.approx(figures["dense_flops"])  # FLOPs in one second
    # Predicting the calibration point gives back its own phase sum.
    prediction = scaling_model.predict(scaling_model.config_shape("criteo_capped"), 2, 4096, rates)
    assert prediction["slowest_rank"]["step_s"] == pytest.approx(1.12, rel=0.02)


def test_nvidias_dcnv2_dense_model_hand_computed():
    dense = scaling_model.config_shape("dlrm_dcnv2_capped").dense
    width = 27 * 128  # the bottom MLP's output beside the 26 embeddings
    assert dense.interaction_width == width
    bottom = 13 * 512 + 512 + 512 * 256 + 256 + 256 * 128 + 128
    cross = 3 * (width * 512 + 512 * width + width)  # U, V and the bias of three rank-512 layers
    top = width * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 512 + 512 + 512 * 256 + 256 + 256 + 1
    assert dense.parameters == bottom + cross + top
    macs = (13 * 512 + 512 * 256 + 256 * 128 + 3 * 2 * width * 512 + width * 1024 + 1024 * 1024 + 1024 * 512
            + 512 * 256 + 256)
    assert dense.flops_per_sample() == 3 * 2 * macs  # no dot interaction
    with pytest.raises(ValueError, match="Expected interaction 'dot' or 'cross'"):
        scaling_model.DenseModel(26, 128, interaction="dcn")


def test_multi_hot_ids_multiply_the_gathered_values_not_the_exchange():
    multi, single = scaling_model.config_shape("dlrm_dcnv2_capped"), scaling_model.config_shape("criteo_capped")
    assert multi.cardinalities == single.cardinalities and sum(multi.hotness) == 214 and single.hotness == (1,) * 26
    one_hot = scaling_model.Shape("one_hot", multi.cardinalities, 128, multi.dense)
    with_ids, without = (scaling_model.plan_figures(shape, 2, 4096) for shape in (multi, one_hot))
    assert with_ids["traffic"] == without["traffic"]  # pooled vectors cross the wire, not ids' rows
    for rank in range(2):
        looked_up = sum(piece.width * multi.hotness[piece.table] for piece in with_ids["plan"].rank_slices[rank])
        replicated = sum(128 * multi.hotness[t] for t in with_ids["plan"].replicated)
        assert with_ids["gathered_values"][rank] == 4096 * looked_up + 2048 * replicated
        assert with_ids["gathered_values"][rank] > without["gathered_values"][rank]


def test_rates_refuse_a_breakdown_of_another_model(tmp_path):
    """A breakdown whose dense gradients are not the config's model's (criteo_capped's MLPs measured under
    dlrm_dcnv2_capped's name) would calibrate a FLOP rate for FLOPs never run."""
    figures = scaling_model.plan_figures(scaling_model.config_shape("criteo_capped"), 2, 2048)
    records = [{"benchmark": "step_breakdown", "mode": "horovod", "config": "dlrm_dcnv2_capped", "rank": rank, "world_size": 2,
                "global_batch_size": 2048, "ms": {"dense_forward_backward": 300.0, "exchange": 30.0, "allreduce": 30.0,
                                                  "lookup": 5.0, "update": 5.0},
                "bytes_per_step": traffic.to_dict()} for rank, traffic in enumerate(figures["traffic"])]
    with pytest.raises(SystemExit, match="the breakdown of dlrm_dcnv2_capped averaged 10966532 bytes of dense gradients a step, "
                                         "where dlrm_dcnv2_capped's model has 65669124: it measured another model"):
        scaling_model.rates_from_breakdown(records)
