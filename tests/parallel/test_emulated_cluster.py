"""Four ranks in four network namespaces on shaped links (``benchmarks/emulated_cluster.py``): the
emulation carries a real training job, and its links' rate is what the exchange sees.

- main.py on tiny data trains on the 4 namespaces as one process does: the AUC within 1e-6 and every
  checkpoint array within 1e-5 (the tolerances of tests/parallel/test_two_hosts.py, argued there);
- the embedding exchange's collective (an alltoall) is timed on the same cluster at a high and a low
  link rate: at the low rate it takes at least the time the rate allows for its bytes, and is
  several times slower than at the high rate.

Skipped, with one line, where the machine cannot make namespaces and shaped links (not root, no
``ip``/``tc``, no namespaces). The namespaces are named ``tfdlrmt*`` and removed at the end.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

import pytest

from conftest import REPO, run_python, worker_env
from tf_dlrm.checkpoint import store as checkpoint_store

sys.path.insert(0, os.path.join(REPO, "benchmarks"))
sys.path.insert(0, os.path.join(REPO, "tests", "checkpoint"))
sys.path.insert(0, os.path.join(REPO, "tests", "bad_inputs"))
from checkpoint_runs import max_difference  # noqa: E402
from emulated_cluster import ClusterError, EmulatedCluster, host_cores, namespaces, tbf_arguments  # noqa: E402
from tiny_dataset import TINY_MODEL, write_tiny  # noqa: E402

pytestmark = pytest.mark.multirank
PREFIX = "tfdlrmt"
RANKS = 4
HIGH_MBIT, LOW_MBIT = 2000.0, 50.0
# 12 steps of batch 256 (local batch 64 on 4 ranks), the last one checkpointed.
STEPS = 12
FLAGS = [*TINY_MODEL, "--epochs=100000", "--checkpoint_every_steps=8", "--evals_per_epoch=0", f"--max_steps={STEPS}"]


@pytest.fixture(scope="module")
def cluster():
    try:
        with EmulatedCluster(RANKS, HIGH_MBIT, prefix=PREFIX) as made:
            yield made
    except ClusterError as error:
        pytest.skip(f"no emulated cluster on this machine: {error}")
    assert not namespaces(PREFIX)


def _run_ranks(cluster: EmulatedCluster, command: list[str], timeout: float) -> list[str]:
    results = cluster.run(command, env=worker_env(), timeout=timeout)
    for rank, (code, output) in enumerate(results):
        assert code == 0, f"rank {rank} exited with {code}:\n{output[-4000:]}"
    return [output for _, output in results]


def test_four_namespaces_train_like_one_process(cluster, tmp_path):
    data = write_tiny(str(tmp_path / "data"))
    save, log = str(tmp_path / "four" / "checkpoints"), str(tmp_path / "four" / "log.jsonl")
    _run_ranks(cluster, [sys.executable, "main.py", f"--dataset_path={data}", *FLAGS, f"--save_checkpoint_path={save}",
                         f"--log_path={log}"], timeout=400)
    four = [json.loads(line) for line in open(log).read().splitlines()]
    assert four[0]["event"] == "config" and len(four[0]["rank_embedding_bytes"]) == RANKS
    assert four[0]["alltoall_bytes_per_step"] > 0  # the lookups crossed the shaped links
    final = four[-1]
    assert final["event"] == "final" and final["world_size"] == RANKS and final["steps"] == STEPS, final

    reference_save, reference_log = str(tmp_path / "one" / "checkpoints"), str(tmp_path / "one" / "log.jsonl")
    run_python(["main.py", f"--dataset_path={data}", *FLAGS, f"--save_checkpoint_path={reference_save}",
                f"--log_path={reference_log}"], timeout=300)
    one = json.loads(open(reference_log).read().splitlines()[-1])
    assert one["world_size"] == 1 and one["steps"] == STEPS
    name = checkpoint_store.checkpoint_name(STEPS)
    difference, where = max_difference(os.path.join(save, name), os.path.join(reference_save, name))
    print(f"{RANKS} namespaces at {HIGH_MBIT:g} Mbit/s: AUC {final['auc']!r}, one process {one['auc']!r}; "
          f"largest checkpoint difference {difference:.3g} in {where}")
    # Four ranks sum each gradient in another order than one process: float32 roundoff of a few
    # ulps per step on weights of order 1 over a dozen steps, far below 1e-5.
    assert difference <= 1e-5, f"largest difference {difference} in {where}"
    # AUC moves only when two scores swap order, by at least 1/(positives x negatives), about 1.6e-5 here.
    assert abs(final["auc"] - one["auc"]) <= 1e-6, (final, one)


def test_a_low_link_rate_slows_the_exchange(cluster, tmp_path):
    values, repeats = 655360, 3  # 2.5 MB of float32 per rank: 1.97 MB leave each rank's link per alltoall
    out = str(tmp_path / "exchange.json")
    # Low first and high last: the fixture's other test finds the links as it made them.
    _run_ranks(cluster, [sys.executable, os.path.join(REPO, "tests", "parallel", "emulated_exchange_worker.py"), out,
                         PREFIX, str(values), str(repeats), f"{LOW_MBIT},{HIGH_MBIT}"], timeout=300)
    record = json.load(open(out))
    low = statistics.median(record["seconds"][str(LOW_MBIT)])
    high = statistics.median(record["seconds"][str(HIGH_MBIT)])
    sent = record["bytes_sent_per_rank"]
    # tbf lets through at most its bucket at once, then the rate: the bytes a rank sends (and, on the
    # switch's side, receives) beyond a full bucket take at least (bytes - bucket) x 8 / rate. The 0.95
    # leaves room for tc's rounding of the rate to its own units.
    burst = int(tbf_arguments(LOW_MBIT)[tbf_arguments(LOW_MBIT).index("burst") + 1])
    floor = (sent - burst) * 8 / (LOW_MBIT * 1e6)
    print(f"alltoall of {sent} bytes sent per rank: {low * 1e3:.1f} ms at {LOW_MBIT:g} Mbit/s (rate floor "
          f"{floor * 1e3:.1f} ms), {high * 1e3:.1f} ms at {HIGH_MBIT:g} Mbit/s")
    assert low >= 0.95 * floor, (low, floor, record)
    # The high rate's floor is LOW/HIGH = 1/40 of the low one's; 3x leaves the rest to the ranks' compute and scheduling.
    assert low >= 3 * high, (low, high, record)


def test_every_host_gets_an_equal_share_of_the_cores():
    assert host_cores(2, [0, 1]) == [[0], [1]]
    assert host_cores(2, [0, 1, 2, 3]) == [[0, 1], [2, 3]]
    assert host_cores(3, [4, 5, 6, 7]) == [[4], [5], [6]]  # an even share: the fourth core stays idle
    # More hosts than cores: each core carries ranks / cores of them, never all the ranks.
    assert host_cores(8, [0, 1]) == [[0], [1]] * 4
    assert [len(cores) for cores in host_cores(8, list(range(16)))] == [2] * 8


def test_a_rank_runs_on_its_hosts_share_of_the_cores(cluster):
    # The rank sees its host's cores as its own, so main.py's default intra-op threads (cores // local ranks) are the
    # cores it has.
    script = "import os; print(sorted(os.sched_getaffinity(0)))"
    seen = [json.loads(output.strip()) for output in _run_ranks(cluster, [sys.executable, "-c", script], timeout=60)]
    assert seen == cluster.cores
    # Pinned by default: each rank holds its share of this machine's cores, never all of them (unless it has one).
    machine = os.sched_getaffinity(0)
    assert all(len(cores) == max(1, len(machine) // RANKS) and set(cores) <= machine for cores in seen), seen
