"""benchmarks/emulated_options.py: the crossover read off measured ratios, and every option's flags
accepted by main.py's own flag parsing (the sweep itself needs root and minutes: run by hand)."""

from __future__ import annotations

import os
import sys

import pytest

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPOSITORY, "benchmarks"))

import emulated_options  # noqa: E402


def test_crossover_interpolates_on_log_bandwidth():
    # Ratio 0.8 at 100, 1.2 at 1000: halfway in log, sqrt(100 * 1000).
    line = emulated_options.crossover([(1000.0, 1.2), (100.0, 0.8)])
    assert line["wins_below_mbit"] == pytest.approx((100 * 1000) ** 0.5, abs=0.1)
    assert line["verdict"].startswith("wins below about 316 Mbit/s")


def test_crossover_everywhere_and_nowhere():
    assert emulated_options.crossover([(200.0, 0.9), (5000.0, 0.99)])["verdict"] == "wins everywhere measured (200-5000 Mbit/s)"
    assert emulated_options.crossover([(200.0, 1.1), (5000.0, 1.5)])["verdict"] == "never at or above 200 Mbit/s"
    assert emulated_options.crossover([(200.0, 1.1), (5000.0, 0.9)])["wins_below_mbit"] is None


def test_every_option_parses_as_main_py_flags():
    from absl import flags

    from tf_dlrm.cli.flags import config_from_flags, define_flags

    for name in emulated_options.OPTIONS:
        values = flags.FlagValues()
        define_flags(None, values)
        values(emulated_options.option_argv(name, "/nonexistent", 2048, 4, 1))
        config = config_from_flags(values)
        assert config.batch_size == 2048
    assert emulated_options.BASELINE["amp_bf16_allreduce"] == "amp"
    assert emulated_options.BASELINE["dedup"] == "plain"
    assert len(emulated_options.CRITEO_FIT) == 26
