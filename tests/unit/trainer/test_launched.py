"""Ranks started by a launcher: the environment torchrun sets is read, and an incomplete or mismatched one is
refused naming the variable and the fix (nothing is started)."""

from __future__ import annotations

import pytest

from meshrl.common.errors import ConfigError
from meshrl.trainer.config import TrainerConfig
from meshrl.trainer.launched import LaunchedRank, Launcher, launched_rank

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.2", "MASTER_PORT": "29500"}


def test_torchrun_environment_gives_the_rank():
    assert launched_rank(Launcher.AUTO, 2, TORCHRUN) == LaunchedRank(1, 2, 0, "127.0.0.2", 29500)
    assert launched_rank(Launcher.ENVIRONMENT, 2, TORCHRUN).rank == 1


def test_spawn_mode_and_auto_without_a_launcher_start_ranks_locally():
    assert launched_rank(Launcher.SPAWN, 2, TORCHRUN) is None
    assert launched_rank(Launcher.AUTO, 2, {"MASTER_ADDR": "h"}) is None


def test_config_names_the_launcher():
    cfg = TrainerConfig.model_validate(
        {"data_parallel": {"launcher": "environment"}, "parallel": {"tensor_parallel": 2}}
    )
    assert cfg.data_parallel.launcher == Launcher.ENVIRONMENT and cfg.world_size == 2
    with pytest.raises(ValueError, match="launcher"):
        TrainerConfig.model_validate({"data_parallel": {"launcher": "mpirun"}})


@pytest.mark.parametrize(
    "env,world,match",
    [
        ({k: v for k, v in TORCHRUN.items() if k != "MASTER_PORT"}, 2, "lacks MASTER_PORT"),
        ({}, 2, "lacks RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT"),
        ({**TORCHRUN, "WORLD_SIZE": "4"}, 2, "'environment WORLD_SIZE' = 4: the config asks for 2 ranks"),
        ({**TORCHRUN, "RANK": "2"}, 2, "must be below WORLD_SIZE=2"),
        ({**TORCHRUN, "RANK": "one"}, 2, "'environment RANK' = 'one': must be an integer"),
        ({**TORCHRUN, "MASTER_PORT": "0"}, 2, "'environment MASTER_PORT' = '0': must be an integer >= 1"),
    ],
    ids=["no-port", "nothing", "world-mismatch", "rank-too-big", "rank-not-int", "port-zero"],
)
def test_bad_launcher_environment_is_refused(env, world, match):
    with pytest.raises(ConfigError, match=match):
        launched_rank(Launcher.ENVIRONMENT, world, env)
