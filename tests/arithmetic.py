"""Tolerances derived from floating-point arithmetic, not fitted to one machine's CPU.

Two computations of the same quantity that round at different places (another CPU's kernels,
another reduction order, XLA's fusions, one sum split over ranks) differ by a bounded number of
units of roundoff of the format they round in. The unit roundoff of a format with ``p`` significant
bits is ``u = 2**-p``: float32 keeps 24 bits (u = 5.96e-8), bfloat16 keeps 8 (u = 2**-8 = 3.9e-3).

The CPUs these tests run on differ (AVX2 only, AVX-512, AVX-512 BF16, AMX): oneDNN runs bfloat16
matmuls natively (one rounding of an fp32 sum) where the CPU has BF16 instructions, while
elsewhere TensorFlow's Eigen kernels convert to float32, multiply and round back, blocking the sums
differently. Both are correct to ``u`` per rounded value, and that is all a test may assume.
"""

from __future__ import annotations

import numpy as np

FLOAT32_UNIT_ROUNDOFF = 2.0**-24
BFLOAT16_UNIT_ROUNDOFF = 2.0**-8

# Environment that makes TensorFlow take, on any x86 CPU, the bfloat16 path of a CPU without native
# bf16 (AMD EPYC with AVX2 only): oneDNN's graph rewrite off (bf16 ops fall to Eigen, as TensorFlow
# does where the CPU lacks AVX-512), oneDNN's remaining float32 GEMMs limited to AVX2. Checked on an
# AVX-512/AMX Xeon: it reproduces the exact figure of the failure seen on such an EPYC machine.
# ONEDNN_MAX_CPU_ISA=AVX2 alone does NOT: TensorFlow still routes bf16 matmuls to oneDNN (it asks
# CPUID, not oneDNN), which then has no AVX2 bf16 kernel: "could not create a primitive descriptor
# for a matmul primitive" and SIGILL.
EMULATED_AVX2_ENV = {"TF_ENABLE_ONEDNN_OPTS": "0", "ONEDNN_MAX_CPU_ISA": "AVX2"}
# name -> extra environment of the processes a test launches
ARITHMETIC_PATHS = {"native": {}, "avx2": EMULATED_AVX2_ENV}


def cpu_has_native_bfloat16() -> bool:
    """Whether this CPU's own run ("native") takes a bf16 path other than the emulated one."""
    from tf_dlrm.train.precision import native_bfloat16, read_cpu_info

    return native_bfloat16(read_cpu_info())[0]


def emulated_path_is_native_here(path: str) -> bool:
    """True for the "avx2" path on a CPU without native bf16 (an AVX2-only EPYC, say): there the
    "native" run already trains in the emulated bf16 arithmetic (TensorFlow routes bf16 to Eigen when
    the CPU lacks BF16 instructions), so a second run would repeat it; only its float32 matmuls would
    move from oneDNN to Eigen, which the float32 tolerances cover on every CPU anyway."""
    return path == "avx2" and not cpu_has_native_bfloat16()


def skip_if_emulated_path_is_native_here(path: str) -> None:
    """Skips a test of the "avx2" path where :func:`emulated_path_is_native_here` says it repeats "native"."""
    import pytest

    if emulated_path_is_native_here(path):
        pytest.skip("this CPU has no native bfloat16: its own run ('native') already takes the emulated bf16 "
                    "path of CPUs without AVX-512 BF16")


def bfloat16_rounding_points(dense_layers: int, interactions: int = 1) -> int:
    """Rounding points along the longest path of one forward + backward pass of a mixed_bfloat16 DLRM.

    Each dense layer rounds its matmul output and its bias-add/activation output to bfloat16 in the
    forward pass, and its input gradient and weight gradient in the backward pass (4 points); the
    interaction rounds its products forward and their gradients backward (2 points, counted as 4 to
    keep one rule). Sums inside a kernel accumulate in float32, whose error is ``2**16`` times smaller.
    """
    return 4 * (dense_layers + interactions)


def bfloat16_update_bound(dense_layers: int, interactions: int = 1) -> float:
    """Largest allowed ``|W_a - W_b|_inf / path(W)`` between two mixed_bfloat16 trainings from the same
    start that differ only in where they round, ``path(W)`` being the summed per-step movement
    ``sum_j |W_j - W_{j-1}|_inf`` of the tensor.

    Each run's computed gradient is within ``m * u`` (relative, first order) of the exact one, ``m``
    rounding points on its path, so the two differ by at most ``2 * m * u`` of the gradient's scale
    per step; the update is ``lr * gradient``, so the difference of the weights is at most
    ``2 * m * u`` times the path they travelled. This assumes the largest gradient entry of a tensor
    is of the order of its entries' absolute sums (no cancellation at tensor scale); a broken update
    (a missing ``1/N``, a gradient sent to the wrong row or rank) is off by the order of the path
    itself: a missing ``1/N`` at N=2 doubles every update (ratio 1), over 5 times this bound for the
    models tested (6 rounding layers: 0.1875).
    """
    return 2 * bfloat16_rounding_points(dense_layers, interactions) * BFLOAT16_UNIT_ROUNDOFF


def bfloat16_forward_bound(dense_layers: int, interactions: int = 1) -> float:
    """Largest allowed ``|z_a - z_b|_inf / max(|z_b|_inf, 1)`` for the logits of two mixed_bfloat16
    forward passes of the same weights: half of the pass's rounding points are in the forward, each
    run within ``m/2 * u`` of the exact value, so the two within ``m * u``."""
    return bfloat16_rounding_points(dense_layers, interactions) * BFLOAT16_UNIT_ROUNDOFF


def relative_to_path(final, reference_final, reference_path) -> float:
    """``|final - reference_final|_inf / reference_path`` (inf if the reference never moved but they differ)."""
    difference = float(np.abs(np.asarray(final, np.float64) - np.asarray(reference_final, np.float64)).max(initial=0.0))
    if reference_path > 0:
        return difference / reference_path
    return 0.0 if difference == 0 else float("inf")


def auc_standard_error(auc: float, positives: int, negatives: int) -> float:
    """Hanley & McNeil (1982), Radiology 143:29-36, eq. 2: the standard error of an AUC estimated on
    ``positives`` + ``negatives`` samples. Two trainings whose arithmetic differs (bf16 vs fp32, one
    CPU's kernels vs another's) follow different trajectories from the first rounding on; their
    validation AUCs differ like two draws of the training noise, which this bounds from the data."""
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    variance = (auc * (1 - auc) + (positives - 1) * (q1 - auc * auc) + (negatives - 1) * (q2 - auc * auc)) / (positives * negatives)
    return float(np.sqrt(variance))


def split_label_counts(dataset_directory) -> tuple[int, int]:
    """(positives, negatives) of the ``validation`` split of a synthetic split_binary dataset."""
    import os

    from tf_dlrm.spec.feature_spec import FeatureSpec

    spec = FeatureSpec.load(os.path.join(str(dataset_directory), "feature_spec.yaml"))
    labels = np.fromfile(spec.split_files("validation").label, dtype=np.uint8)
    positives = int(labels.sum())
    return positives, int(labels.size - positives)


def float32_sum_bound(absolute_sum, terms: int) -> np.ndarray:
    """Higham, *Accuracy and Stability of Numerical Algorithms* (2002), eq. 3.5: a float32 sum of
    ``terms`` products, in any order and with or without FMA, is within
    ``gamma_n * sum |x_i y_i|``, ``gamma_n = n u / (1 - n u)``, of the exact value. ``absolute_sum``
    is the same computation on the operands' absolute values (in float64)."""
    n = terms * FLOAT32_UNIT_ROUNDOFF
    return np.asarray(absolute_sum, np.float64) * n / (1 - n)
