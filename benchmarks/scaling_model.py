r"""A scaling model of hybrid-parallel DLRM, pure Python (no TensorFlow, no Horovod).

    python benchmarks/scaling_model.py --rates=BREAKDOWN.jsonl [--check_measured=SCALING.jsonl]
        [--check_breakdown=BREAKDOWN_AT_ANOTHER_BATCH.jsonl] [--check_emulated=EMULATED.jsonl --cores=2]
        [--world_sizes=8,16,64,256] [--batch_sizes=32768,262144] [--criteo_sample=TSV]

For the MLPerf Criteo 1TB tables (26 cardinalities, dim 128, the ``--max-ind-range=40000000`` profile
of facebookresearch/dlrm's ``dlrm_s_pytorch.py`` and of mlcommons/inference's DLRM reference: "Criteo
Terabyte MLPerf training") and MLPerf's MLPs (bottom 13-512-256-128, top 479-1024-1024-512-256-1),
and for each world size N and global batch B, prints:

- the plan's table memory per rank (tf_dlrm's own planner, ``auto`` strategy, small tables replicated);
- the embedding alltoall bytes each rank sends per step (forward + backward) and the ring allreduce
  bytes of the dense gradients (:mod:`tf_dlrm.sharding.traffic`);
- the step time these predict: ``max over ranks of (dense FLOPs / FLOP rate + gathered values x
  cost per value + alltoall bytes / alltoall rate + allreduce bytes / allreduce rate)``, no overlap
  assumed, each rank as fast as one rank measured here and the network as fast as Gloo's loopback; and
  (``predicted_on_links``) the same on networks of the ``--links`` rates and ``--latency_us`` (:class:`Link`).

The rates come from ``benchmarks/step_breakdown.py`` output (``--rates``; its Horovod ranks): the
dense forward+backward milliseconds at a known local batch give FLOP/s, the exchange and allreduce
milliseconds at known bytes give bytes/s, lookup + update at known gathered values give seconds per
value. With ``--check_measured`` (``benchmarks/scaling.py`` output) it predicts the same config at
that run's world size and batch and prints predicted vs measured samples/s (goal: within 25%).

With ``--check_emulated`` (``benchmarks/emulated_cluster.py --breakdown`` output: ranks in network
namespaces on links shaped to a bandwidth) it predicts each run at its link's bandwidth and latency
(:class:`Link`), with ``--cores`` the cores those ranks shared, and prints predicted vs measured
step, phase by phase. The checks predict the config the rates were measured on (``criteo_capped``, or
``dlrm_dcnv2_capped``: multi-hot ids, NVIDIA's DCNv2 cross layers; :func:`config_shape`).

With hot-row replication (``with_hot_rows``, one entry per id distribution): the hottest rows of the
model-parallel tables, chosen as the planner does under ``--hot_rows_budget`` (a fraction of their
memory), replicated on every rank; expected hit rates, memory per rank, cold-row alltoall plus the
sparse hot-gradient allgather, and the step they predict (:mod:`scaling_hot_rows`). Id distributions:
Zipf with the exponents of ``--zipf_exponents`` on every table (the synthetic generator's
``--zipf_exponents``; the exponent refitted on ids drawn from it is printed), and per table the
exponent fitted on the shared Criteo sample (``--criteo_sample``; least squares of ``log count`` on
``log rank``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
from typing import Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tf_dlrm.sharding.packing import send_width  # noqa: E402
from tf_dlrm.sharding.plan import TableSpec  # noqa: E402
from tf_dlrm.sharding.planner import make_plan  # noqa: E402
from tf_dlrm.sharding.traffic import step_traffic  # noqa: E402

from scaling_hot_rows import fit_exponent, hot_row_figures  # noqa: E402

# facebookresearch/dlrm, dlrm_s_pytorch.py and data_utils.py, "--max-ind-range=40000000" (the
# MLPerf training configuration); the same list is in mlcommons/inference recommendation/dlrm.
MLPERF_CRITEO_1TB_CARDINALITIES = (
    39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10, 2208, 11938, 155, 4, 976,
    14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36)
MLPERF_BOTTOM = (512, 256, 128)
MLPERF_TOP = (1024, 1024, 512, 256, 1)
NUM_NUMERICAL = 13
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class DenseModel:
    """FLOPs and parameters of DLRM's dense part: bottom MLP, interaction (``dot``: the pairwise dot products,
    ``cross``: NVIDIA's DCNv2, ``cross_layers`` low-rank cross layers over the bottom output and the
    embeddings), top MLP."""

    def __init__(self, tables: int, dim: int, bottom: Sequence[int] = MLPERF_BOTTOM, top: Sequence[int] = MLPERF_TOP,
                 interaction: str = "dot", cross_layers: int = 3, cross_rank: int = 512):
        if interaction not in ("dot", "cross"):
            raise ValueError(f"Expected interaction 'dot' or 'cross'. Received: {interaction!r}")
        vectors = tables + 1
        cross = interaction == "cross"
        self.interaction_width = vectors * dim if cross else dim + vectors * (vectors - 1) // 2
        # A cross layer x0 * (V (U x) + b) + x: two matmuls through the rank, one bias of the width.
        self.cross = [(self.interaction_width, cross_rank, self.interaction_width)] * (cross_layers if cross else 0)
        self.layers = list(zip((NUM_NUMERICAL, *bottom[:-1]), bottom)) + list(zip((self.interaction_width, *top[:-1]), top))
        self.vectors, self.dim = vectors, dim

    @property
    def parameters(self) -> int:
        cross = sum(width * rank + rank * width + width for width, rank, _ in self.cross)
        return sum(fan_in * fan_out + fan_out for fan_in, fan_out in self.layers) + cross

    def flops_per_sample(self) -> float:
        """Forward 2 in out per layer; backward twice that (input and weight gradients); the dot
        interaction's lower triangle F^2 D / 2 multiply-adds forward and F^2 D backward."""
        mlp = sum(2 * fan_in * fan_out for fan_in, fan_out in self.layers)
        mlp += sum(2 * (width * rank + rank * width) for width, rank, _ in self.cross)
        interaction = 0 if self.cross else self.vectors**2 * self.dim
        return 3 * mlp + 3 * interaction


@dataclasses.dataclass(frozen=True)
class Shape:
    """What the model predicts from: the tables (rows, ids per sample) and the dense part."""

    name: str
    cardinalities: tuple[int, ...]
    dim: int
    dense: DenseModel
    hotness: tuple[int, ...] = ()  # ids per sample of each table; () for one each

    def ids(self, table: int) -> int:
        return self.hotness[table] if self.hotness else 1


def mlperf_shape() -> Shape:
    """The MLPerf Criteo 1TB tables and DLRM (the projections' model)."""
    return Shape("mlperf_criteo_1tb", MLPERF_CRITEO_1TB_CARDINALITIES, 128, DenseModel(len(MLPERF_CRITEO_1TB_CARDINALITIES), 128))


def config_shape(config: str) -> Shape:
    """A benchmark config's shape (``train_throughput.CONFIGS``: its feature spec's tables and hotness,
    its MLPs and interaction), read without TensorFlow."""
    import yaml

    from train_throughput import CONFIGS

    if config not in CONFIGS:
        raise SystemExit(f"Expected a config of train_throughput.CONFIGS {sorted(CONFIGS)}. Received: {config!r}")
    bench = CONFIGS[config]
    with open(os.path.join(REPOSITORY, bench.feature_spec)) as handle:
        spec = yaml.safe_load(handle)
    features = [spec["feature_spec"][name] for name in spec["channel_spec"]["categorical"]]
    params = dict(bench.params)
    dense = DenseModel(len(features), bench.embedding_dim, params.get("bottom_mlp_dims", bench.bottom_mlp_dims),
                       params.get("top_mlp_dims", bench.top_mlp_dims), interaction=params.get("interaction", "dot"),
                       cross_layers=params.get("num_cross_layers", 3), cross_rank=params.get("cross_low_rank", 512))
    return Shape(config, tuple(int(f["cardinality"]) for f in features), bench.embedding_dim, dense,
                 tuple(int(f.get("hotness", 1)) for f in features))


def plan_figures(shape: Shape, world_size: int, global_batch: int, value_bytes: int = 4,
                 data_parallel_threshold: int = 2048) -> dict:
    """Memory, bytes and gathered values per rank of tf_dlrm's plan for these tables."""
    tables = [TableSpec(f"table_{i}", rows, shape.dim) for i, rows in enumerate(shape.cardinalities)]
    plan = make_plan(tables, world_size, "auto", data_parallel_threshold=data_parallel_threshold)
    feature_tables = list(range(len(tables)))
    widths = [send_width(plan, r, feature_tables) for r in range(world_size)]
    replicated_values = sum(plan.tables[t].elements for t in plan.replicated)
    payload = (shape.dense.parameters + replicated_values) * 4 if world_size > 1 else 0
    traffic = step_traffic(widths if world_size > 1 else [0], global_batch, value_bytes, payload)
    local = global_batch // world_size
    # Rows each rank reads per sample: a slice's width once per id of its table (multi-hot: several).
    looked_up = [sum(piece.width * shape.ids(piece.table) for piece in plan.rank_slices[r]) for r in range(world_size)]
    replicated_looked_up = sum(plan.tables[t].dim * shape.ids(t) for t in plan.replicated)
    return {
        "plan": plan,
        "rank_bytes": [plan.rank_bytes(r) for r in range(world_size)],
        "traffic": traffic,
        # Values each rank gathers (and updates): its slices for the global batch, replicated tables locally.
        "gathered_values": [global_batch * w + local * replicated_looked_up for w in looked_up],
        "dense_flops": shape.dense.flops_per_sample() * local,
    }


def rates_from_breakdown(records: list[dict]) -> dict:
    """Per-rank rates from ``step_breakdown`` records (Horovod ranks) of one config."""
    ranks = [r for r in records if r.get("benchmark") == "step_breakdown" and r.get("mode") == "horovod"]
    if not ranks:
        raise SystemExit("--rates: no step_breakdown record with mode 'horovod' in the file")
    config = ranks[0].get("config", "criteo_capped")
    world_size, global_batch = ranks[0]["world_size"], ranks[0]["global_batch_size"]
    figures = plan_figures(config_shape(config), world_size, global_batch)
    measured_payload = ranks[0]["bytes_per_step"]["allreduce_payload"]
    # Within 1%: the trainer may average a scalar or two beyond the model's weights.
    if abs(measured_payload - figures["traffic"][0].allreduce_payload) > 0.01 * figures["traffic"][0].allreduce_payload:
        raise SystemExit(f"--rates: the breakdown of {config} averaged {measured_payload} bytes of dense gradients a step, "
                         f"where {config}'s model has {figures['traffic'][0].allreduce_payload}: it measured another model")
    flops, a2a, ar, per_value = [], [], [], []
    for record in ranks:
        rank, ms = record["rank"], record["ms"]
        flops.append(figures["dense_flops"] / (ms["dense_forward_backward"] / 1e3))
        sent = record["bytes_per_step"]["alltoall_forward_sent"] + record["bytes_per_step"]["alltoall_backward_sent"]
        a2a.append(sent / (ms["exchange"] / 1e3))
        ar.append(record["bytes_per_step"]["allreduce_sent"] / (ms["allreduce"] / 1e3))
        per_value.append((ms["lookup"] + ms["update"]) / 1e3 / figures["gathered_values"][rank])
    return {"calibrated_on": {"config": config, "world_size": world_size, "global_batch_size": global_batch},
            "dense_flop_per_s": statistics.median(flops), "alltoall_bytes_per_s": statistics.median(a2a),
            "allreduce_bytes_per_s": statistics.median(ar), "seconds_per_gathered_value": statistics.median(per_value)}


class Link:
    """A host's network link: ``bandwidth_mbit`` each way (full duplex, a non-blocking switch) and a
    one-way ``latency_us`` per message."""

    def __init__(self, bandwidth_mbit: float, latency_us: float = 0.0):
        if bandwidth_mbit <= 0 or latency_us < 0:
            raise ValueError(f"Expected bandwidth_mbit > 0 and latency_us >= 0. Received: bandwidth_mbit={bandwidth_mbit}, "
                             f"latency_us={latency_us}")
        self.bytes_per_s, self.latency_s = bandwidth_mbit * 1e6 / 8, latency_us * 1e-6

    def seconds(self, sent_bytes: float, messages: int) -> float:
        return sent_bytes / self.bytes_per_s + messages * self.latency_s


def predict(shape: Shape, world_size: int, global_batch: int, rates: dict,
            exchange_bytes: Sequence[float] | None = None, link: Link | None = None, cores: int = 0) -> dict:
    """The slowest rank's step; ``exchange_bytes`` (per rank) replaces the plan's alltoall bytes
    (hot-row replication: cold rows plus the hot-gradient allgather, at the alltoall's rate).

    With ``link``, each collective also pays its bytes (an alltoall: those sent and those received, one
    after the other) at the link's rate and its messages' latency (an
    alltoall: N - 1 messages each way, forward and backward; a ring allreduce: 2 (N - 1) steps), on top
    of the rates measured (what the collective costs the ranks' CPUs, which a link does not remove).
    With ``cores`` (ranks sharing one machine's cores, as in an emulated cluster), the compute of a
    rank slows by ``max(1, N / cores)`` against the calibration run's ``max(1, N_calibrated / cores)``.
    """
    figures = plan_figures(shape, world_size, global_batch)
    shared = 1.0
    if cores:
        shared = max(1.0, world_size / cores) / max(1.0, rates["calibrated_on"]["world_size"] / cores)
    steps = []
    for rank, traffic in enumerate(figures["traffic"]):
        compute = figures["dense_flops"] / rates["dense_flop_per_s"] * shared
        embedding = figures["gathered_values"][rank] * rates["seconds_per_gathered_value"] * shared
        sent = traffic.alltoall_forward_sent + traffic.alltoall_backward_sent
        sent = sent if exchange_bytes is None else exchange_bytes[rank]
        exchange = sent / rates["alltoall_bytes_per_s"]
        allreduce = traffic.allreduce_sent / rates["allreduce_bytes_per_s"]
        if link is not None and world_size > 1:
            # Gloo's alltoall sends to a peer only once the peer's receive is announced, and that notice
            # travels on the same TCP stream as the peer's own data: when two ranks enter apart, the second's
            # notice waits behind its data and the pair's two directions go one after the other. So the link
            # carries a rank's sent and received bytes in turn: the worst case, which 2 ranks measure (more
            # ranks fill the wait with other peers' bytes and come in under it).
            wire = sent if exchange_bytes is not None else (
                traffic.alltoall_forward_sent + traffic.alltoall_forward_received
                + traffic.alltoall_backward_sent + traffic.alltoall_backward_received)
            exchange += link.seconds(wire, 2 * (world_size - 1))
            allreduce += link.seconds(traffic.allreduce_sent, 2 * (world_size - 1))
        steps.append({"dense_s": compute, "embedding_s": embedding, "exchange_s": exchange, "allreduce_s": allreduce,
                      "step_s": compute + embedding + exchange + allreduce})
    slowest = max(steps, key=lambda s: s["step_s"])
    return {"figures": figures, "slowest_rank": {k: round(v, 4) for k, v in slowest.items()},
            "samples_per_s": global_batch / slowest["step_s"]}


def check_emulated(records: list[dict], rates: dict, cores: int) -> list[dict]:
    """Predicted against measured step of each emulated-cluster run (``benchmarks/emulated_cluster.py
    --breakdown``: world size x link), the measured phases of its slowest rank beside them."""
    config = rates["calibrated_on"]["config"]
    shape = config_shape(config)
    runs = {}
    for record in records:
        # Rates are a config's own (its matmul shapes, its ids per sample): other configs' runs are left out.
        if record.get("emulated_cluster") and record.get("benchmark") == "step_breakdown" and record.get("config") == config:
            runs.setdefault((record["world_size"], record["bandwidth_mbit"], record["latency_us"],
                             record["global_batch_size"]), []).append(record)
    out = []
    for (world_size, bandwidth, latency, batch), ranks in sorted(runs.items()):
        slowest = max(ranks, key=lambda r: r["phase_sum_ms"])
        prediction = predict(shape, world_size, batch, rates, link=Link(bandwidth, latency), cores=cores)["slowest_rank"]
        predicted_ms = prediction["step_s"] * 1e3
        ms = slowest["ms"]
        out.append({
            "benchmark": "scaling_model_emulated", "config": config, "world_size": world_size,
            "bandwidth_mbit": bandwidth, "latency_us": latency, "global_batch_size": batch, "cores": cores,
            "measured_ms": {"compute": slowest["compute_ms"], "exchange": ms["exchange"], "allreduce": ms["allreduce"],
                            "phase_sum": slowest["phase_sum_ms"], "fused_step": max(r["step_ms"] for r in ranks)},
            "predicted_ms": {"compute": round((prediction["dense_s"] + prediction["embedding_s"]) * 1e3, 2),
                             "exchange": round(prediction["exchange_s"] * 1e3, 2),
                             "allreduce": round(prediction["allreduce_s"] * 1e3, 2), "step": round(predicted_ms, 2)},
            "predicted_over_measured": round(predicted_ms / slowest["phase_sum_ms"], 3),
            "within_20_percent": abs(predicted_ms / slowest["phase_sum_ms"] - 1) <= 0.2,
        })
    return out


def zipf_exponents(path: str, columns: int = 26) -> dict:
    """Per categorical feature of a Criteo TSV (label, 13 integers, 26 hex ids): the least-squares
    slope ``s`` of ``log count = c - s log rank`` over its ids' counts, rank 1 the most frequent."""
    counts = [dict() for _ in range(columns)]
    with open(path) as handle:
        for line in handle:
            fields = line.rstrip("\n").split("\t")
            for i, value in enumerate(fields[14:14 + columns]):
                if value:
                    counts[i][value] = counts[i].get(value, 0) + 1
    return {f"cat_{i}": fit_exponent(list(table.values())) for i, table in enumerate(counts)}


def synthetic_refit(exponent: float, rows: int = 1_000_000, draws: int = 1_000_000) -> float | None:
    """The exponent fitted (as on the Criteo sample) on ids drawn by the synthetic generator's sampler."""
    import numpy as np

    from tf_dlrm.data.hidden_model import _power_law_ranks

    ranks = _power_law_ranks(np.random.default_rng(0), draws, rows, exponent)
    return fit_exponent(np.bincount(ranks, minlength=rows))


def with_hot_rows(shape: Shape, prediction: dict, exponents, budget: float, batch: int, rates: dict,
                  min_count_per_step: float = 0.0) -> dict:
    """Hot-row figures of the prediction's plan (of ``shape``) under Zipf ``exponents`` and the step they predict."""
    figures = prediction["figures"]
    plan = figures["plan"]
    hot = hot_row_figures(plan, exponents, budget, batch, min_count_per_step=min_count_per_step)
    predicted = predict(shape, plan.world_size, batch, rates, exchange_bytes=hot["exchange_bytes_per_rank"])
    return {
        "budget": budget, "hot_rows": hot["hot_rows"], "expected_hit_rate": round(hot["expected_hit_rate"], 4),
        "table_bytes_per_rank_max": max(figures["rank_bytes"]) + hot["hot_bytes_per_rank"],
        "cold_alltoall_bytes_per_step": int(hot["cold_alltoall_bytes_per_step"]),
        "hot_gradient_allgather_bytes_per_step": int(hot["hot_gradient_allgather_bytes_per_step"]),
        "hot_gradient_union_allreduce_bytes_per_step": int(hot["hot_gradient_union_allreduce_bytes_per_step"]),
        "hot_gradient_combine": hot["hot_gradient_combine"],
        "exchange_bytes_per_step": int(hot["bytes_per_step_with_hot_rows"]),
        "exchange_ratio": round(hot["ratio"], 4) if hot["ratio"] is not None else None,
        "predicted": {**predicted["slowest_rank"], "samples_per_s": round(predicted["samples_per_s"], 1)},
    }


def read_jsonl(path: str) -> list[dict]:
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.startswith("{")]


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", required=True,
                        help="step_breakdown.py output (JSON lines) of one config (criteo_capped, dlrm_dcnv2_capped): "
                             "the rates, and the config the --check_* files are predicted as")
    parser.add_argument("--check_measured", default="", help="scaling.py output (JSON lines) to predict")
    parser.add_argument("--check_breakdown", default="",
                        help="step_breakdown.py output (JSON lines) at another batch: its fused train "
                             "step (step_ms, slowest rank) is the measured figure")
    parser.add_argument("--check_emulated", default="",
                        help="benchmarks/emulated_cluster.py --breakdown output (JSON lines) to predict (the rates' config's runs), "
                             "each run at its link's bandwidth and latency")
    parser.add_argument("--cores", type=int, default=0,
                        help="cores the emulated cluster's ranks shared (their compute slows beyond that many ranks)")
    parser.add_argument("--links", default="25000,100000,200000",
                        help="network rates (Mbit/s each way per host) to predict the MLPerf tables on")
    parser.add_argument("--latency_us", type=float, default=5.0, help="one-way latency of those networks")
    parser.add_argument("--world_sizes", default="8,16,64,256")
    parser.add_argument("--batch_sizes", default="32768,262144")
    samples = os.environ.get("TF_DLRM_CRITEO_SAMPLES") or os.path.join(os.path.dirname(REPOSITORY), "shared", "data")
    parser.add_argument("--criteo_sample", default=os.path.join(samples, "criteo_1tb_day0_sample_1k.tsv"),
                        help="Criteo TSV rows to fit Zipf exponents on (skipped when absent)")
    parser.add_argument("--zipf_exponents", default="1.05,1.2", help="synthetic id distributions (Zipf on every table)")
    parser.add_argument("--hot_rows_budget", type=float, default=0.1,
                        help="hot rows' memory as a fraction of the model-parallel tables'")
    args = parser.parse_args(argv)
    if not 0 < args.hot_rows_budget <= 1:
        raise SystemExit(f"--hot_rows_budget must be in (0, 1]. Received: {args.hot_rows_budget}")
    rates = rates_from_breakdown(read_jsonl(args.rates))
    links = [float(b) for b in args.links.split(",") if b]
    out = [{"benchmark": "scaling_model_rates", **{k: (round(v, 12) if isinstance(v, float) else v) for k, v in rates.items()}}]
    mlperf, calibrated = mlperf_shape(), config_shape(rates["calibrated_on"]["config"])
    tables = len(mlperf.cardinalities)
    distributions = {}
    for exponent in (float(e) for e in args.zipf_exponents.split(",") if e):
        distributions[f"zipf_{exponent:g}"] = [exponent] * tables
        out.append({"benchmark": "scaling_model_zipf", "source": f"synthetic generator, zipf_exponent={exponent:g}",
                    "refitted_exponent": synthetic_refit(exponent)})
    if os.path.exists(args.criteo_sample):
        fitted = zipf_exponents(args.criteo_sample, tables)
        out.append({"benchmark": "scaling_model_zipf", "source": args.criteo_sample, "exponents": fitted})
        distributions["criteo_sample_fit"] = [fitted[f"cat_{i}"] or 0.0 for i in range(tables)]
    for world_size in (int(w) for w in args.world_sizes.split(",")):
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            prediction = predict(mlperf, world_size, batch, rates)
            figures = prediction["figures"]
            traffic = figures["traffic"]
            out.append({
                "benchmark": "scaling_model", "tables": "mlperf_criteo_1tb", "dim": 128, "world_size": world_size,
                "global_batch_size": batch,
                "table_bytes_per_rank": {"max": max(figures["rank_bytes"]), "min": min(figures["rank_bytes"])},
                "single_process_table_bytes": figures["plan"].total_bytes(),
                "alltoall_bytes_sent_per_rank_per_step": max(t.alltoall_forward_sent + t.alltoall_backward_sent for t in traffic),
                "allreduce_bytes_sent_per_rank_per_step": traffic[0].allreduce_sent,
                "allreduce_payload_bytes": traffic[0].allreduce_payload,
                "predicted": {**prediction["slowest_rank"], "samples_per_s": round(prediction["samples_per_s"], 1)},
                # The same ranks on a network of each --links rate (bytes at the link's rate on top of their CPU cost).
                "predicted_on_links": {
                    f"{bandwidth:g}": {**linked["slowest_rank"], "samples_per_s": round(linked["samples_per_s"], 1)}
                    for bandwidth, linked in ((b, predict(mlperf, world_size, batch, rates, link=Link(b, args.latency_us))) for b in links)},
                # Two choices of hot rows: the budget's hottest, and of those only rows expected at
                # least N times per step (the ones whose replication saves bytes; see scaling_hot_rows).
                "with_hot_rows": {name: with_hot_rows(mlperf, prediction, exponents, args.hot_rows_budget, batch, rates)
                                  for name, exponents in distributions.items()},
                "with_hot_rows_seen_n_times": {
                    name: with_hot_rows(mlperf, prediction, exponents, args.hot_rows_budget, batch, rates,
                                  min_count_per_step=world_size)
                    for name, exponents in distributions.items()},
            })
    if args.check_measured:
        for record in read_jsonl(args.check_measured):
            if record.get("benchmark") != "scaling" or record.get("variant", "default") != "default" or record["world_size"] < 2:
                continue
            prediction = predict(calibrated, record["world_size"], record["global_batch_size"], rates)
            measured = record["samples_per_s"]["median"]
            ratio = prediction["samples_per_s"] / measured
            out.append({"benchmark": "scaling_model_check", "config": calibrated.name, "world_size": record["world_size"],
                        "global_batch_size": record["global_batch_size"], "measured_by": "scaling.py",
                        "load_average_1m": record.get("load_average_1m"), "predicted_samples_per_s": round(prediction["samples_per_s"], 1),
                        "measured_samples_per_s": measured, "predicted_over_measured": round(ratio, 3),
                        "within_25_percent": abs(ratio - 1) <= 0.25, "predicted_step": prediction["slowest_rank"]})
    if args.check_breakdown:
        ranks = [r for r in read_jsonl(args.check_breakdown) if r.get("benchmark") == "step_breakdown" and r.get("mode") == "horovod"]
        if ranks:
            world_size, batch = ranks[0]["world_size"], ranks[0]["global_batch_size"]
            measured = batch / (max(r["step_ms"] for r in ranks) / 1e3)
            prediction = predict(calibrated, world_size, batch, rates)
            ratio = prediction["samples_per_s"] / measured
            out.append({"benchmark": "scaling_model_check", "config": calibrated.name, "world_size": world_size,
                        "global_batch_size": batch, "measured_by": "step_breakdown train_step",
                        "predicted_samples_per_s": round(prediction["samples_per_s"], 1), "measured_samples_per_s": round(measured, 1),
                        "predicted_over_measured": round(ratio, 3), "within_25_percent": abs(ratio - 1) <= 0.25,
                        "predicted_step": prediction["slowest_rank"]})
    if args.check_emulated:
        out.extend(check_emulated(read_jsonl(args.check_emulated), rates, args.cores))
    for line in out:
        print(json.dumps(line), flush=True)
    return out


if __name__ == "__main__":
    main()
