"""examples/din_model.py (a DIN-style attention over a weighted sequence feature, weighted ``mean`` on a
column-wise table, weighted ``sum`` on a replicated one) trained with ``model.fit`` on 2 and 3 ranks (ids exchanged,
or read for the global batch by their tables' owners) equals one process: every table, the dense weights, the embedding outputs of a probe batch (pooled and sequence) and the
probe scores; a 2-rank checkpoint restored in one process exports a SavedModel that plain TensorFlow serves
with the weighted ragged inputs, to the scores of the model that was trained.

Tolerances. The ranks add the same float32 numbers as one process in other orders (the pooled gradients'
sums, the dense allreduce, the replicated table's gradient average), each sum of the 48-row batch off by a few
units of 2**-24 relative. Tables, embedding outputs and scores: 1e-5 relative to max(|expected|, 0.05), the
tables' initial bound (an entry near zero keeps the absolute rounding of its path: 12 steps of SGD or Adagrad,
each a few ulps of values of size 0.05). Dense weights take Adam steps of about lr = 0.01 whatever the
gradient's size; where an entry's gradient nearly cancels over the batch, its reordered sum changes m / sqrt(v)
by up to 1e-5 relative, so 12 steps may leave 12 * 0.01 * 1e-5 = 1.2e-6 absolute: their bound. A wrong weight, a
lost gradient scale or a mixed-up position is off by 1e-3 or more."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import launch, run_python

SCRIPT = "examples/din_model.py"
ARGS = ["--steps=12", "--global_batch=48"]
DENSE_BOUND = 12 * 0.01 * 1e-5


def relative(actual, expected, floor: float = 0.05) -> float:
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float((np.abs(actual - expected) / np.maximum(np.abs(expected), floor)).max())


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    path = tmp_path_factory.mktemp("din") / "np1.npz"
    run_python([SCRIPT, *ARGS, f"--output={path}"], timeout=600)
    return dict(np.load(path))


def test_one_process_trains_and_pads_the_sequences(one_process):
    from examples.din_model import PROBE_ROWS, RECENT_TAGS, ROWS, make_data, make_features
    from tf_dlrm.embedding.table_init import initial_table_slice

    tables = list(dict.fromkeys(f.table for f in make_features()))
    for index, table in enumerate(tables):
        start = initial_table_slice(7, index, table.vocabulary_size, table.embedding_dim, init_bound=table.init_bound)
        assert np.abs(one_process[f"table/{table.name}"] - start).max() > 1e-3, f"{table.name} did not train"
    probe = make_data(PROBE_ROWS, 107)
    # Positions past a sample's recent tags are zeros; the others are that tag's row.
    recent, tags = one_process["output/recent_tags"], one_process["table/tags"]
    starts = np.concatenate([[0], np.cumsum(probe["recent_tags_lengths"])[:-1]])
    for row, (start, length) in enumerate(zip(starts, probe["recent_tags_lengths"])):
        ids = probe["recent_tags_values"][start:start + length]
        np.testing.assert_allclose(recent[row, :length], tags[ids], rtol=1e-6)
        np.testing.assert_array_equal(recent[row, length:], np.zeros((RECENT_TAGS - length, 8)))
    assert one_process["table/items"].shape == (ROWS["items"], 8)


def check_equal(many: dict, one: dict, label: str) -> dict:
    assert sorted(many) == sorted(one)
    worst = {}
    for name in sorted(one):
        if name.startswith("dense/"):
            worst[name] = float(np.abs(np.asarray(many[name], np.float64) - one[name]).max())
            assert worst[name] <= DENSE_BOUND, f"{name} differs on {label}: {worst[name]}"
        else:
            worst[name] = relative(many[name], one[name])
            assert worst[name] <= 1e-5, f"{name} differs on {label}: {worst[name]}"
    kinds = {kind: max(v for k, v in worst.items() if k.startswith(kind)) for kind in ("table/", "output/", "dense/", "probe")}
    print(f"{label}: largest differences from one process: tables {kinds['table/']:.3g} (relative), "
          f"outputs {kinds['output/']:.3g} (relative), probe scores {kinds['probe']:.3g} (relative), "
          f"dense {kinds['dense/']:.3g} (absolute)")
    return worst


@pytest.mark.multirank
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("ids", ["exchanged", "global"])
def test_fit_on_n_ranks_equals_one_process(one_process, world_size, ids, tmp_path):
    """``exchanged``: every rank reads its local batch and the ids (and weights) travel to the tables' owners;
    ``global``: each rank reads the global batch of the features whose tables it owns (main.py's loader)."""
    path = tmp_path / f"np{world_size}.npz"
    launch(world_size, [SCRIPT, *ARGS, f"--output={path}", *(["--global_ids"] if ids == "global" else [])], timeout=600)
    check_equal(dict(np.load(path)), one_process, f"{world_size} ranks, {ids} ids")


@pytest.mark.multirank
def test_a_two_rank_checkpoint_exports_and_serves_weighted_ragged_inputs(one_process, tmp_path):
    from tests.embedding.interest_model import serve_without_tf_dlrm

    checkpoint, trained = tmp_path / "checkpoint", tmp_path / "np2.npz"
    launch(2, [SCRIPT, *ARGS, f"--output={trained}", f"--save={checkpoint}"], timeout=600)
    exported, probe, restored = tmp_path / "serving", tmp_path / "probe.npz", tmp_path / "restored.npz"
    run_python([SCRIPT, *ARGS, f"--restore={checkpoint}", f"--export={exported}", f"--probe={probe}",
                f"--output={restored}"], timeout=600)
    two, one = dict(np.load(trained)), dict(np.load(restored))
    for name in two:  # restored in one process: the very weights the ranks trained
        if not name.startswith(("probe", "output/")):
            np.testing.assert_array_equal(one[name], two[name], err_msg=name)
    served = serve_without_tf_dlrm(str(exported), str(probe), str(tmp_path / "served.npy"))
    inputs = np.load(probe)
    assert {"history_values", "history_row_lengths", "history_weights_values", "history_weights_row_lengths",
            "tags_weights_values", "genres_weights"} <= set(inputs)
    # The served graph pools as the layer did on 2 ranks, in another order of float sums: 1e-6 of a probability.
    np.testing.assert_allclose(served, two["probe_scores"], rtol=0, atol=1e-6)
    print(f"served vs 2-rank model: largest score difference {np.abs(served - two['probe_scores']).max():.3g}")
