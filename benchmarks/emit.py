"""Prints benchmark records: one JSON object per measured case and line (the benchmark output
contract), each stamped with the CPU it was measured on, so that figures from different machines
(AVX2 only, AVX-512, AVX-512 BF16, AMX) are never compared by mistake."""

from __future__ import annotations

import functools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tf_dlrm.train.precision import native_bfloat16, read_cpu_info  # noqa: E402

# Environment variables that change which kernels TensorFlow runs, hence the figures.
KERNEL_ENVIRONMENT = ("ONEDNN_MAX_CPU_ISA", "TF_ENABLE_ONEDNN_OPTS", "TF_DLRM_DISABLE_KERNELS")


@functools.lru_cache(maxsize=1)
def machine() -> dict:
    """The CPU model, its avx2 / avx512f / avx512_bf16 / amx_bf16 flags, whether TensorFlow runs bf16
    natively here, and the kernel-selecting environment variables that are set."""
    cpu = read_cpu_info()
    native, _ = native_bfloat16(cpu)
    environment = {name: os.environ[name] for name in KERNEL_ENVIRONMENT if name in os.environ}
    return {**cpu.summary(), "bf16_native": native, "environment": environment}


def emit(record: dict) -> None:
    print(json.dumps({**record, "cpu": machine()}), flush=True)
