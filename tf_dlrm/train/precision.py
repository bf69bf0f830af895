"""Which precision ``--amp`` trains in, from what the CPU offers. Pure Python: no TensorFlow import.

bfloat16 pays off on a CPU only where TensorFlow's oneDNN kernels run it natively: AVX-512 BF16
(``vdpbf16ps``) or AMX-BF16 tiles. Elsewhere (AVX2-only CPUs such as many AMD EPYCs) TensorFlow's
Eigen kernels convert every operand to float32, multiply, and round back: the same work as fp32 plus
the conversions, so ``--amp`` is faster than fp32 only where bf16 is native (benchmarks/results/performance.md, *bf16 and the CPU*,
has the measurements).

``--amp`` takes three values: ``true`` (bf16 on CPU whatever the CPU, with a notice where it is
emulated), ``auto`` (bf16 only where native, else float32, saying so) and ``false``.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from typing import Mapping

CPU_FLAGS_OF_INTEREST = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
NATIVE_BFLOAT16_FLAGS = ("avx512_bf16", "amx_bf16")
# oneDNN ISA limits (ONEDNN_MAX_CPU_ISA) at or above which bf16 matmuls run on BF16 instructions.
NATIVE_BFLOAT16_ISAS = frozenset({
    "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX10_1_512", "AVX512_CORE_AMX", "AVX10_1_512_AMX",
    "AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX_FP16", "ALL", "DEFAULT",
})


class AmpMode(str, enum.Enum):
    OFF = "false"
    ON = "true"
    AUTO = "auto"

    @classmethod
    def parse(cls, value) -> "AmpMode":
        """``True``/``False`` (and absl's spellings of them) or ``"auto"``."""
        if isinstance(value, AmpMode):
            return value
        if isinstance(value, bool):
            return cls.ON if value else cls.OFF
        text = str(value).strip().lower()
        if text in ("true", "t", "1", "yes", "on"):
            return cls.ON
        if text in ("false", "f", "0", "no", "off"):
            return cls.OFF
        if text == "auto":
            return cls.AUTO
        raise ValueError(f"Expected --amp to be true, false or auto. Received: --amp={value!r}")


@dataclasses.dataclass(frozen=True)
class CpuInfo:
    """The CPU's model name and instruction-set flags, as Linux reports them in /proc/cpuinfo."""

    model: str
    flags: frozenset

    def summary(self) -> dict:
        """For logs and benchmark lines: the model and the flags that decide bf16 and kernel speed."""
        return {"model": self.model, **{flag: flag in self.flags for flag in CPU_FLAGS_OF_INTEREST}}


def read_cpu_info(path: str = "/proc/cpuinfo") -> CpuInfo:
    """The first processor's model and flags; an unknown CPU (no such file) has no flags."""
    model, flags = "unknown", frozenset()
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model == "unknown":
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = frozenset(value.split())
                if model != "unknown" and flags:
                    break
    except OSError:
        pass
    return CpuInfo(model, flags)


def native_bfloat16(cpu: CpuInfo, environ: Mapping[str, str] = os.environ) -> tuple[bool, str]:
    """Whether TensorFlow runs bf16 natively here, and why not when it does not.

    Native needs a BF16 instruction set, oneDNN's graph rewrite on (``TF_ENABLE_ONEDNN_OPTS`` not 0;
    off, bf16 falls to Eigen's float32 emulation) and no ``ONEDNN_MAX_CPU_ISA`` below AVX512_CORE_BF16.
    """
    present = [flag for flag in NATIVE_BFLOAT16_FLAGS if flag in cpu.flags]
    if not present:
        return False, f"this CPU ({cpu.model}) has no native bfloat16 (neither {' nor '.join(NATIVE_BFLOAT16_FLAGS)})"
    if environ.get("TF_ENABLE_ONEDNN_OPTS", "").strip().lower() in ("0", "false"):
        return False, "TF_ENABLE_ONEDNN_OPTS=0 turns off oneDNN, whose kernels run bfloat16 natively"
    isa = environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if isa and isa not in NATIVE_BFLOAT16_ISAS:
        return False, f"ONEDNN_MAX_CPU_ISA={isa} keeps oneDNN below AVX512_CORE_BF16"
    return True, f"native bfloat16 ({', '.join(present)})"


@dataclasses.dataclass(frozen=True)
class PrecisionChoice:
    policy: str  # a Keras mixed-precision policy name
    native: bool  # the policy runs natively on this hardware (float32 always does)
    notice: str | None  # one line for the user when the choice deserves it


def choose_precision(amp, on_gpu: bool, cpu: CpuInfo | None = None,
                     environ: Mapping[str, str] = os.environ) -> PrecisionChoice:
    """The Keras policy for ``--amp=amp``: mixed_float16 on GPU, mixed_bfloat16 on CPU, float32 off."""
    mode = AmpMode.parse(amp)
    if mode is AmpMode.OFF:
        return PrecisionChoice("float32", True, None)
    if on_gpu:
        return PrecisionChoice("mixed_float16", True, None)
    native, reason = native_bfloat16(cpu or read_cpu_info(), environ)
    if native:
        return PrecisionChoice("mixed_bfloat16", True, None)
    if mode is AmpMode.AUTO:
        return PrecisionChoice("float32", True, f"--amp=auto: {reason}, so training runs in float32, usually faster here.")
    return PrecisionChoice(
        "mixed_bfloat16", False,
        f"--amp: {reason}; bfloat16 is emulated and usually SLOWER than float32 here "
        "(0.7x on criteo_capped on an AVX2-only EPYC): train without --amp, or use --amp=auto.",
    )
