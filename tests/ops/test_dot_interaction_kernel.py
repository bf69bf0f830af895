"""tf_dlrm's dot-interaction CPU kernel (tf_dlrm/ops/dot_interaction.cc) against float64 numpy,
against the generic TensorFlow path, and its build script's failure handling."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from arithmetic import BFLOAT16_UNIT_ROUNDOFF, float32_sum_bound
from tf_dlrm import ops
from tf_dlrm.models.layers.interaction import DotInteraction, lower_triangle_indices

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def library():
    loaded = ops.kernels()
    assert loaded is not None, f"{ops.LIBRARY} is not built: scripts/install.sh runs python -m tf_dlrm.ops.build"
    return loaded


def reference(bottom, embeddings, include_diagonal, upstream):
    """Forward and gradient in float64 from the definition."""
    vectors = np.concatenate([bottom[:, None], embeddings], axis=1).astype(np.float64)
    count = vectors.shape[1]
    pairs = lower_triangle_indices(count, include_diagonal)
    products = np.einsum("bid,bjd->bij", vectors, vectors).reshape(len(bottom), -1)
    forward = np.concatenate([bottom, products[:, pairs]], axis=1)
    width = bottom.shape[1]
    weights = np.zeros((len(bottom), count * count))
    weights[:, pairs] = upstream[:, width:]
    weights = weights.reshape(-1, count, count)
    gradient = np.einsum("bij,bjd->bid", weights + weights.transpose(0, 2, 1), vectors)
    gradient[:, 0] += upstream[:, :width]
    return forward, gradient[:, 0], gradient[:, 1:]


def test_the_installer_built_the_kernel():
    library()


@pytest.mark.parametrize("include_diagonal", [False, True])
@pytest.mark.parametrize("batch,tables,width", [(1, 1, 1), (5, 3, 7), (33, 26, 16), (9, 4, 33), (17, 30, 24)])
def test_kernel_matches_float64_reference(batch, tables, width, include_diagonal):
    rng = np.random.default_rng(batch * 100 + tables * 10 + width)
    bottom = rng.normal(size=(batch, width)).astype(np.float32)
    embeddings = rng.normal(size=(batch, tables, width)).astype(np.float32)
    row = width + len(lower_triangle_indices(tables + 1, include_diagonal))
    upstream = rng.normal(size=(batch, row)).astype(np.float32)
    out = library().tf_dlrm_dot_interaction(bottom, embeddings, include_diagonal=include_diagonal)
    grads = library().tf_dlrm_dot_interaction_grad(bottom, embeddings, upstream, include_diagonal=include_diagonal)
    expected = reference(bottom, embeddings, include_diagonal, upstream)
    # Each output is a float32 sum of products: within gamma_n of the sum of the products' absolute
    # values (the reference on absolute values), n terms: ``width`` for a dot product, one per vector
    # (twice for the diagonal) plus the bottom's pass-through for a gradient entry.
    bounds = reference(np.abs(bottom), np.abs(embeddings), include_diagonal, np.abs(upstream))
    terms = max(width, 2 * (tables + 1) + 1)
    for actual, wanted, bound in zip([out.numpy(), grads[0].numpy(), grads[1].numpy()], expected, bounds):
        assert np.all(np.abs(actual - wanted) <= float32_sum_bound(bound, terms)), np.abs(actual - wanted).max()


@pytest.mark.parametrize("include_diagonal", [False, True])
def test_layer_kernel_and_generic_paths_agree_in_a_tf_function(include_diagonal):
    rng = np.random.default_rng(3)
    bottom = tf.constant(rng.normal(size=(64, 16)), tf.float32)
    embeddings = tf.constant(rng.normal(size=(64, 26, 16)), tf.float32)
    results = []
    for use_kernel in (True, False):
        layer = DotInteraction(include_diagonal)
        layer.use_kernel = use_kernel

        @tf.function
        def step(bottom, embeddings):
            with tf.GradientTape() as tape:
                tape.watch([bottom, embeddings])
                out = layer((bottom, embeddings))
                loss = tf.reduce_sum(out * tf.sin(tf.range(out.shape[1], dtype=tf.float32)))
            return out, tape.gradient(loss, [bottom, embeddings])

        out, gradients = step(bottom, embeddings)
        results.append([out.numpy()] + [g.numpy() for g in gradients])
        ops_in_graph = {op.type for op in step.get_concrete_function(bottom, embeddings).graph.get_operations()}
        assert ("TfDlrmDotInteraction" in ops_in_graph) == use_kernel
    # Two float32 evaluations of the same sums of products, each within gamma_n of sum |products|
    # (the float64 reference on absolute values, tests/arithmetic.py), so within twice that of each other.
    upstream = np.abs(np.sin(np.arange(results[0][0].shape[1])))[None].repeat(64, axis=0)
    bounds = reference(np.abs(bottom.numpy()), np.abs(embeddings.numpy()), include_diagonal, upstream)
    for kernel, generic, bound in zip(*results, bounds):
        assert np.all(np.abs(kernel - generic) <= 2 * float32_sum_bound(bound, 2 * 27 + 1)), np.abs(kernel - generic).max()


def test_empty_batch():
    out = library().tf_dlrm_dot_interaction(np.zeros((0, 4), np.float32), np.zeros((0, 3, 4), np.float32))
    assert out.shape == (0, 4 + 6)


def test_bad_shapes_are_named():
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"expected bottom \[batch, D\] and embeddings \[batch, T, D\]"):
        library().tf_dlrm_dot_interaction(np.zeros((2, 4), np.float32), np.zeros((2, 3, 5), np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"upstream must be \[2, 10\]"):
        library().tf_dlrm_dot_interaction_grad(np.zeros((2, 4), np.float32), np.zeros((2, 3, 4), np.float32), np.zeros((2, 9), np.float32))


@pytest.mark.parametrize("include_diagonal", [False, True])
@pytest.mark.parametrize("batch,tables,width", [(5, 3, 7), (33, 26, 16), (17, 26, 128)])
def test_bfloat16_kernel_matches_float64_reference(batch, tables, width, include_diagonal):
    """bfloat16 in and out, float32 inside. The reference is float64 on the same bf16 inputs. A
    product of two bf16 values (8 significant bits each) is exact in float32 (24 bits); the kernel
    sums n of them in float32 (within gamma_n of sum |products|, tests/arithmetic.py) and rounds the
    sum once to bfloat16 (within u = 2**-8 of its magnitude, which sum |products| bounds). So
    |kernel - reference| <= u * S + (1 + u) * gamma_n * S with S = sum |products|."""
    rng = np.random.default_rng(batch + tables + width)
    as_bf16 = lambda a: tf.cast(tf.constant(a, tf.float32), tf.bfloat16)  # noqa: E731
    bottom = as_bf16(rng.normal(size=(batch, width)))
    embeddings = as_bf16(rng.normal(size=(batch, tables, width)))
    row = width + len(lower_triangle_indices(tables + 1, include_diagonal))
    upstream = as_bf16(rng.normal(size=(batch, row)))
    out = library().tf_dlrm_dot_interaction(bottom, embeddings, include_diagonal=include_diagonal)
    grads = library().tf_dlrm_dot_interaction_grad(bottom, embeddings, upstream, include_diagonal=include_diagonal)
    assert out.dtype == grads[0].dtype == grads[1].dtype == tf.bfloat16
    exact = [t.numpy().astype(np.float64) for t in (bottom, embeddings, upstream)]
    expected = reference(exact[0], exact[1], include_diagonal, exact[2])
    bounds = reference(np.abs(exact[0]), np.abs(exact[1]), include_diagonal, np.abs(exact[2]))
    terms = max(width, 2 * (tables + 1) + 1)
    worst = 0.0
    for actual, wanted, bound in zip([out, grads[0], grads[1]], expected, bounds):
        tolerance = BFLOAT16_UNIT_ROUNDOFF * bound + (1 + BFLOAT16_UNIT_ROUNDOFF) * float32_sum_bound(bound, terms)
        error = np.abs(actual.numpy().astype(np.float64) - wanted)
        assert np.all(error <= tolerance), (error - tolerance).max()
        worst = max(worst, float((error / np.maximum(bound, 1e-30)).max()))
    # The bound is not vacuous: the errors are bf16 roundings, of the order of u, not of float32's.
    assert worst > 2.0**-24 * 8


def test_bfloat16_layer_uses_the_kernel():
    layer = DotInteraction(dtype="mixed_bfloat16")
    bottom = tf.cast(tf.ones((2, 4)), tf.bfloat16)

    @tf.function
    def call(bottom, embeddings):
        return layer((bottom, embeddings))

    embeddings = tf.cast(tf.ones((2, 3, 4)), tf.bfloat16)
    out = call(bottom, embeddings)
    assert out.dtype == tf.bfloat16 and out.shape == (2, 10)
    np.testing.assert_array_equal(out.numpy().astype(np.float32)[:, 4:], 4.0)
    assert "TfDlrmDotInteraction" in {op.type for op in call.get_concrete_function(bottom, embeddings).graph.get_operations()}


def run_python(code: str, **environment) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPOSITORY, capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **environment}, timeout=300)


def test_disable_switch_falls_back_to_tensorflow_ops():
    done = run_python("from tf_dlrm import ops; print(ops.kernels())", TF_DLRM_DISABLE_KERNELS="1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None"


def test_build_is_skipped_when_up_to_date_and_a_failed_build_keeps_the_library():
    library()
    with open(ops.LIBRARY, "rb") as handle:
        before = hashlib.sha256(handle.read()).hexdigest()
    done = run_python("import sys; from tf_dlrm.ops import build; sys.exit(build.main([]))")
    assert done.returncode == 0 and "up to date" in done.stderr, done.stderr
    failed = run_python("import sys; from tf_dlrm.ops import build; sys.exit(build.main(['--force']))", CXX="/bin/false")
    assert failed.returncode != 0
    assert "compiling failed" in failed.stderr and "/bin/false" in failed.stderr
    with open(ops.LIBRARY, "rb") as handle:
        assert hashlib.sha256(handle.read()).hexdigest() == before
    assert not os.path.exists(ops.LIBRARY + ".partial")


def test_a_library_built_from_other_sources_is_refused_by_name(tmp_path):
    # The same library beside a stamp of other sources (as after a pull that changed the .cc without a
    # reinstall): the layers must fall back with a reason, not load kernels that may lack a dtype.
    stale_stamp = tmp_path / "stamp"
    stale_stamp.write_text("sources of an older checkout\n")
    done = run_python(
        "from tf_dlrm import ops; from tf_dlrm.ops import build; "
        f"build.STAMP = {str(stale_stamp)!r}; print(ops.unavailable_reason()); print(ops.kernels())")
    assert done.returncode == 0, done.stderr
    reason, loaded = done.stdout.strip().splitlines()
    assert "stamp differs" in reason and ops.LIBRARY in reason and "python -m tf_dlrm.ops.build" in reason
    assert loaded == "None"
    assert "stamp differs" in done.stderr  # the one warning of kernels()


def test_the_package_and_its_build_name_the_same_library():
    from tf_dlrm.ops import build

    assert ops.LIBRARY == build.LIBRARY
