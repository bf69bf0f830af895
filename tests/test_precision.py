"""``--amp`` and the CPU: what is native, what each mode picks, and the line a user sees."""

from __future__ import annotations

import json
import os

import pytest

from tf_dlrm.train.precision import AmpMode, CpuInfo, choose_precision, native_bfloat16, read_cpu_info

EPYC = CpuInfo("AMD EPYC 7B13 64-Core Processor", frozenset({"sse4_2", "avx", "avx2", "fma"}))
COOPER_LAKE = CpuInfo("Intel(R) Xeon(R) Platinum 8380H", frozenset({"avx2", "avx512f", "avx512_bf16"}))
SAPPHIRE_RAPIDS = CpuInfo("Intel(R) Xeon(R) Processor", frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}))


def test_cpuinfo_is_read_from_the_first_processor(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13 64-Core Processor\n"
        "flags\t\t: fpu sse4_2 avx avx2 fma\n\nprocessor\t: 1\nmodel name\t: other\nflags\t\t: avx512_bf16\n"
    )
    cpu = read_cpu_info(str(path))
    assert cpu.model == EPYC.model and cpu.flags == EPYC.flags | {"fpu"}
    assert cpu.summary() == {"model": EPYC.model, "avx2": True, "avx512f": False, "avx512_bf16": False, "amx_bf16": False}
    assert read_cpu_info(str(tmp_path / "missing")) == CpuInfo("unknown", frozenset())


@pytest.mark.parametrize("cpu, environ, native", [
    (EPYC, {}, False),
    (COOPER_LAKE, {}, True),
    (SAPPHIRE_RAPIDS, {}, True),
    (SAPPHIRE_RAPIDS, {"TF_ENABLE_ONEDNN_OPTS": "0"}, False),
    (SAPPHIRE_RAPIDS, {"ONEDNN_MAX_CPU_ISA": "AVX2"}, False),
    (SAPPHIRE_RAPIDS, {"ONEDNN_MAX_CPU_ISA": "avx512_core"}, False),
    (SAPPHIRE_RAPIDS, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, True),
    (SAPPHIRE_RAPIDS, {"TF_ENABLE_ONEDNN_OPTS": "1"}, True),
])
def test_native_bfloat16_needs_the_instructions_and_onednn(cpu, environ, native):
    found, reason = native_bfloat16(cpu, environ)
    assert found is native, reason
    if not native:
        assert "native bfloat16" in reason or "oneDNN" in reason or "ONEDNN" in reason


@pytest.mark.parametrize("amp, on_gpu, cpu, policy, noticed", [
    ("false", False, EPYC, "float32", False),
    ("false", True, SAPPHIRE_RAPIDS, "float32", False),
    ("true", True, EPYC, "mixed_float16", False),
    ("auto", True, EPYC, "mixed_float16", False),
    ("true", False, SAPPHIRE_RAPIDS, "mixed_bfloat16", False),
    ("auto", False, SAPPHIRE_RAPIDS, "mixed_bfloat16", False),
    ("true", False, EPYC, "mixed_bfloat16", True),  # what the user asked for, with a warning
    ("auto", False, EPYC, "float32", True),  # falls back, and says so
])
def test_choose_precision(amp, on_gpu, cpu, policy, noticed):
    choice = choose_precision(amp, on_gpu, cpu, environ={})
    assert choice.policy == policy
    assert (choice.notice is not None) is noticed
    assert choice.native is not (amp == "true" and noticed)
    if noticed:
        assert cpu.model in choice.notice and "float32" in choice.notice


def test_amp_mode_parses_absl_spellings_and_refuses_others():
    assert [AmpMode.parse(v) for v in (True, "t", "1", "TRUE", False, "0", "false", "auto")] == [
        AmpMode.ON, AmpMode.ON, AmpMode.ON, AmpMode.ON, AmpMode.OFF, AmpMode.OFF, AmpMode.OFF, AmpMode.AUTO]
    with pytest.raises(ValueError, match=r"Expected --amp to be true, false or auto. Received: --amp='fast'"):
        AmpMode.parse("fast")


def run_main(tmp_path, name, *flags, env=None):
    from arithmetic import EMULATED_AVX2_ENV
    from conftest import REPO, run_python

    log = tmp_path / f"{name}.jsonl"
    completed = run_python([
        "main.py", "--dataset_type=synthetic", f"--feature_spec={os.path.join(REPO, 'feature_specs', 'synthetic_small.yaml')}",
        "--embedding_dim=8", "--bottom_mlp_dims=16,8", "--top_mlp_dims=16,1", "--batch_size=256", "--max_steps=2",
        "--evals_per_epoch=0", f"--log_path={log}", *flags,
    ], env=EMULATED_AVX2_ENV if env is None else env, check=False)
    events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return completed, events


def test_amp_on_a_cpu_without_native_bf16_says_so_in_one_line(tmp_path):
    completed, events = run_main(tmp_path, "amp", "--amp")
    assert completed.returncode == 0, completed.stderr[-3000:]
    # Progress and notices go to stderr (rank 0), as every line the trainer prints.
    lines = [line for line in completed.stderr.splitlines() if line.startswith("notice: --amp:")]
    assert len(lines) == 1, completed.stderr
    assert "bfloat16 is emulated" in lines[0] and "--amp=auto" in lines[0]
    config = next(e for e in events if e["event"] == "config")
    assert config["precision"] == "mixed_bfloat16" and config["precision_native"] is False and config["amp"] == "true"
    assert set(config["cpu"]) == {"model", "avx2", "avx512f", "avx512_bf16", "amx_bf16"}
    notice = next(e for e in events if e["event"] == "notice")
    assert notice["flag"] == "--amp=true" and notice["message"] in lines[0]


def test_amp_auto_falls_back_to_float32_where_bf16_is_emulated(tmp_path):
    completed, events = run_main(tmp_path, "auto", "--amp=auto")
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert any(line.startswith("notice: --amp=auto:") for line in completed.stderr.splitlines()), completed.stderr
    config = next(e for e in events if e["event"] == "config")
    assert config["precision"] == "float32" and config["amp"] == "auto"


def test_amp_with_a_bad_value_is_refused(tmp_path):
    completed, _ = run_main(tmp_path, "bad", "--amp=sometimes", env={})
    assert completed.returncode != 0
    assert "Expected --amp to be true, false or auto. Received: --amp='sometimes'" in completed.stderr
