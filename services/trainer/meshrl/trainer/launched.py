"""Trainer ranks started by a launcher (torchrun, a Kubernetes indexed Job, Slurm): this process's rank read
from the environment that such launchers set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).

`data_parallel.launcher` picks the mode: `spawn` (rank 0 starts ranks 1..N-1 as its own child processes, what
`meshrl run` uses), `environment` (every rank is started by the launcher with the same config; rank 0 serves
gRPC and drives the others, which only join and run its commands), or `auto` (environment when RANK and
WORLD_SIZE are both set, else spawn). Called by `meshrl.trainer.__main__` and `runtime`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from meshrl.common.errors import ConfigError

__all__ = ["Launcher", "LaunchedRank", "launched_rank"]

REQUIRED = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class Launcher(StrEnum):
    AUTO = "auto"
    SPAWN = "spawn"
    ENVIRONMENT = "environment"


@dataclass(frozen=True)
class LaunchedRank:
    """This process's place in a launcher-started world; the rendezvous is `env://` (torchrun's agent store)."""

    rank: int
    world: int
    local_rank: int
    master_address: str
    master_port: int


def _int(env: Mapping[str, str], name: str, low: int) -> int:
    raw = env.get(name, "")
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < low:
        raise ConfigError(
            f"environment {name}",
            raw,
            f"must be an integer >= {low}",
            f"start the trainer with a launcher that sets {name} (torchrun does), or set data_parallel.launcher=spawn",
        )
    return value


def launched_rank(launcher: Launcher, world_size: int, env: Mapping[str, str] | None = None) -> LaunchedRank | None:
    """This process's rank when started by a launcher, else None (spawn mode). Raises ConfigError, naming the
    variable, when the environment is incomplete or its WORLD_SIZE differs from the config's ranks."""
    env = os.environ if env is None else env
    if launcher == Launcher.SPAWN:
        return None
    if launcher == Launcher.AUTO and not ("RANK" in env and "WORLD_SIZE" in env):
        return None
    missing = [name for name in REQUIRED if not env.get(name)]
    if missing:
        raise ConfigError(
            "data_parallel.launcher",
            str(launcher),
            f"the environment lacks {', '.join(missing)}",
            "start every rank with torchrun (or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT), "
            "or use data_parallel.launcher=spawn",
        )
    world = _int(env, "WORLD_SIZE", 1)
    if world != world_size:
        raise ConfigError(
            "environment WORLD_SIZE",
            world,
            f"the config asks for {world_size} ranks (data_parallel.size x parallel.tensor_parallel x "
            "parallel.pipeline_parallel)",
            "start that many ranks (torchrun --nnodes x --nproc-per-node) or change the config",
        )
    rank = _int(env, "RANK", 0)
    if rank >= world:
        raise ConfigError("environment RANK", rank, f"must be below WORLD_SIZE={world}", "check the launcher")
    return LaunchedRank(
        rank=rank,
        world=world,
        local_rank=_int(env, "LOCAL_RANK", 0) if env.get("LOCAL_RANK") else 0,
        master_address=env["MASTER_ADDR"],
        master_port=_int(env, "MASTER_PORT", 1),
    )
