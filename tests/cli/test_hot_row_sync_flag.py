"""``--hot_row_sync_every``: parsed into ShardingConfig, refused (naming the flag) when it cannot apply."""

from __future__ import annotations

import dataclasses

import pytest
from tf_dlrm.cli.model_config import ShardingConfig


def parse(argv):
    from tf_dlrm.cli import main as cli  # defines main.py's flags on absl's FLAGS
    from tf_dlrm.cli.flags import config_from_flags

    cli.FLAGS.unparse_flags()
    cli.FLAGS(["main.py", "--dataset_path=/nowhere", *argv])
    return config_from_flags(cli.FLAGS)


def test_default_is_exact_sync_and_the_flag_reaches_the_config():
    assert parse([]).sharding.hot_row_sync_every == 1
    config = parse(["--hot_rows_budget=0.1", "--hot_row_sync_every=16"])
    assert config.sharding.hot_row_sync_every == 16 and config.sharding.hot_rows_budget == 0.1


@pytest.mark.parametrize("every", [0, -3])
def test_not_positive_is_refused_naming_the_flag(every):
    with pytest.raises(ValueError, match=f"--hot_row_sync_every={every}"):
        parse(["--hot_rows_budget=0.1", f"--hot_row_sync_every={every}"])


def test_without_hot_rows_is_refused_naming_both_flags():
    with pytest.raises(ValueError, match=r"--hot_row_sync_every=4 .* needs --hot_rows_budget > 0"):
        parse(["--hot_row_sync_every=4"])
    with pytest.raises(ValueError, match="--hot_row_sync_every"):
        ShardingConfig(hot_row_sync_every=2.5, hot_rows_budget=0.1)


def test_one_rank_is_refused_naming_the_flag():
    config = parse(["--hot_rows_budget=0.1", "--hot_row_sync_every=4"])
    with pytest.raises(ValueError, match="--hot_row_sync_every=4 needs several ranks"):
        config.check_world_size(1)
    config.check_world_size(2)
    exact = dataclasses.replace(config, sharding=dataclasses.replace(config.sharding, hot_row_sync_every=1))
    exact.check_world_size(1)  # the default does nothing with one rank, as --hot_rows_budget
