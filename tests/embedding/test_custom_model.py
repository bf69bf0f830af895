"""A model that is none of tf_dlrm's, built from the public API only (tests/embedding/interest_model.py: a
lazy-Adam table shared by a one-hot and a ragged multi-hot feature, a column-wise Adagrad table, a row-wise
Adagrad table with hot rows, a replicated SGD table, a dynamic table of raw int64 keys), trained with
``model.fit`` on 2 and 3 ranks by tests/embedding/custom_model_worker.py, equals one process: every table,
every table's optimizer state and every dense weight.

Tolerance: ranks and one process add the same float32 numbers in other orders (the dense allreduce, the
pooled gradients' sums, the replicated tables' counts), each sum off by a few units of 2**-24 relative; 12
steps of Adam and Adagrad, whose updates divide by square roots of those sums, keep the drift near 1e-6
relative. Every value is held to 1e-5 relative to max(|expected|, floor): the floor is 1e-3 for optimizer state,
1e-2 for dense weights, and a table's initial bound (0.05) for its values, which are sums of steps of
about 0.01 on starting values of that size: an entry that ends near zero keeps the absolute rounding of its
path (12 steps of a few units of 2**-24 x 0.05, about 1e-8), not of its final size. A wrong gradient scale, a
lost update or a mixed-up slice is off by 1e-3 or more. A dense weight takes Adam steps of lr * m / sqrt(v), about
lr = 0.01 each whatever the gradient's size: where an entry's gradient nearly cancels over the batch, the last bits
that the order of the sums changes move m / sqrt(v) by up to 1e-6 relative, so 12 steps leave up to about
12 * 0.01 * 1e-6 = 1.2e-7 absolute (1e-8 measured on 4 ranks, on a weight of 1e-3): hence its floor of 1e-2. Lazy Adam's epsilon is 1e-4 in the worker: its step
lr * m / (sqrt(v) + eps) moves a row whose gradient cancels to nearly zero by up to lr * error / eps, and the
sum order changes such a gradient's few last bits; at the default 1e-7 one such row moved 5e-7 apart on 3 ranks."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import launch, run_python

WORKER = "tests/embedding/custom_model_worker.py"


def relative(actual, expected, floor: float = 1e-3) -> float:
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float((np.abs(actual - expected) / np.maximum(np.abs(expected), floor)).max())


def floor_of(name: str) -> float:
    """A table's initial bound for its values (every table's, the dynamic one's too, is the default 0.05); 1e-2 for
    dense weights; 1e-3 for optimizer state."""
    from tf_dlrm.embedding.table_config import DEFAULT_INIT_BOUND

    kind = name.partition("/")[0]
    return DEFAULT_INIT_BOUND if kind == "table" else 1e-2 if kind == "dense" else 1e-3


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    path = tmp_path_factory.mktemp("custom") / "np1.npz"
    run_python([WORKER, f"--output={path}"], timeout=600)
    return dict(np.load(path))


def test_one_process_keeps_each_tables_own_optimizer_state(one_process):
    # Lazy Adam: two moments per element; Adagrad: one accumulator per element; row-wise Adagrad: one per
    # row; SGD: none.
    assert sorted(k for k in one_process if k.startswith("state/")) == [
        "state/categories/accumulator", "state/items/m", "state/items/v", "state/queries/accumulator",
        "state/users/accumulator"]
    from tests.embedding.interest_model import make_data

    seen = np.unique(make_data(12 * 48, 5)["query"])  # the worker's 12 steps of 48 rows
    np.testing.assert_array_equal(one_process["dynamic/queries/keys"], seen)  # one row per key seen, none evicted
    assert one_process["table/queries"].shape == (seen.size, 8)
    assert one_process["state/categories/accumulator"].shape == (500, 1)
    assert one_process["state/users/accumulator"].shape == (3000, 8)


@pytest.mark.multirank
@pytest.mark.parametrize("world_size", [2, 3])
def test_fit_on_n_ranks_equals_one_process(one_process, world_size, tmp_path):
    path = tmp_path / f"np{world_size}.npz"
    launch(world_size, [WORKER, f"--output={path}"], timeout=600)
    many = dict(np.load(path))
    assert sorted(many) == sorted(one_process)
    check_trained_like(many, one_process, world_size)


def check_trained_like(many: dict, one_process: dict, world_size: int) -> None:
    from tests.embedding.interest_model import make_features
    from tf_dlrm.embedding.table_init import initial_table_slice

    for index, feature in enumerate(dict.fromkeys(f.table for f in make_features() if not f.table.dynamic)):
        start = initial_table_slice(5, index, feature.vocabulary_size, feature.embedding_dim, init_bound=feature.init_bound)
        assert np.abs(one_process[f"table/{feature.name}"] - start).max() > 1e-3, f"{feature.name} did not train"
    for name in sorted(set(one_process) - {"slices_per_table", "bands_per_table"}):
        assert relative(many[name], one_process[name], floor_of(name)) <= 1e-5, f"{name} differs on {world_size} ranks"


@pytest.fixture(scope="module")
def one_process_auto(tmp_path_factory):
    path = tmp_path_factory.mktemp("custom_auto") / "np1.npz"
    run_python([WORKER, f"--output={path}", "--placements=auto"], timeout=600)
    return dict(np.load(path))


@pytest.mark.multirank
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_every_placement_auto_trains_on_n_ranks_like_one_process(one_process_auto, world_size, tmp_path):
    """The model from the library's names with every placement left to the planner: a row-wise Adagrad table read
    by a one-hot and a ragged feature, lazy Adam, Adagrad, a replicated and a dynamic table. The planner never cuts
    the row-wise table's columns (its state would not stay exact on column slices read by several lookups per
    sample; at N = 4 it cuts it into row bands, each row whole on one rank) and may cut the others: it trains on
    every N, to the same weights and optimizer state as one process."""
    path = tmp_path / f"auto_np{world_size}.npz"
    launch(world_size, [WORKER, f"--output={path}", "--placements=auto"], timeout=600)
    many = dict(np.load(path))
    assert sorted(many) == sorted(one_process_auto)
    items, categories = 0, 2  # in the order of first use in make_features (the dynamic table is not planned)
    # Columns whole (one slice per band); replicated.
    assert many["slices_per_table"][items] == many["bands_per_table"][items] and many["slices_per_table"][categories] == 0
    check_trained_like(many, one_process_auto, world_size)


@pytest.mark.multirank
def test_a_hand_written_loop_around_the_training_step_equals_fit(one_process, tmp_path):
    path = tmp_path / "manual.npz"
    launch(2, [WORKER, f"--output={path}", "--loop=manual"], timeout=600)
    manual = dict(np.load(path))
    assert sorted(manual) == sorted(one_process)
    for name in sorted(one_process):
        assert relative(manual[name], one_process[name], floor_of(name)) <= 1e-5, f"{name}: the loop differs from fit"


@pytest.mark.multirank
def test_checkpoint_on_two_ranks_restores_on_three_and_serves_without_tf_dlrm(tmp_path):
    from tests.embedding.interest_model import serve_without_tf_dlrm

    checkpoints = tmp_path / "checkpoints"
    launch(2, [WORKER, f"--output={tmp_path / 'saved.npz'}", f"--save={checkpoints}"], timeout=600)
    launch(3, [WORKER, f"--output={tmp_path / 'restored.npz'}", f"--restore={checkpoints}"], timeout=600)
    saved, restored = dict(np.load(tmp_path / "saved.npz")), dict(np.load(tmp_path / "restored.npz"))
    assert sorted(saved) == sorted(restored)
    for name in saved:  # a restore moves the saved float32 values, whatever the plan: bit for bit
        np.testing.assert_array_equal(restored[name], saved[name], err_msg=name)

    # One process (tf_dlrm's kernels as they are: the export traces TensorFlow's ops) restores the 2-rank
    # checkpoint and exports; plain TensorFlow (a process that never imports tf_dlrm) serves it.
    exported = tmp_path / "serving"
    run_python([WORKER, f"--output={tmp_path / 'export.npz'}", f"--restore={checkpoints}", f"--export={exported}",
                f"--probe={tmp_path / 'probe.npz'}"], timeout=600)
    expected = dict(np.load(tmp_path / "export.npz"))["probe_scores"]
    served = serve_without_tf_dlrm(str(exported), str(tmp_path / "probe.npz"), str(tmp_path / "served.npy"))
    assert served.shape == expected.shape == (40,)
    np.testing.assert_allclose(served, expected, rtol=0, atol=1e-6)
