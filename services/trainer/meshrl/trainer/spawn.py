"""Spawn mode's ranks 1..N-1: rank 0 (`python -m meshrl.trainer`) starts them as `python -m meshrl.trainer.worker`
child processes at the very start, before its own import of megatron-core, so that every rank imports in parallel
with it. The rendezvous port is not known then: rank 0's store binds it later (`dp.rank_zero_store`) and rank 0
writes it to each child's stdin (`tell_port`); a child started with `--master HOST:-` reads it there (`read_port`)
once its own imports are done. Called by `meshrl.trainer.__main__`, `runtime` and `worker`.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import IO

from meshrl.common.errors import Unavailable

__all__ = ["PORT_FROM_STDIN", "SpawnedRanks", "read_port", "spawn_ranks"]

log = logging.getLogger(__name__)
PORT_FROM_STDIN = "-"
CONFIG_ENV = "MESHRL_TRAINER_CONFIG_JSON"


@dataclass
class SpawnedRanks:
    """Ranks 1..N-1 started by rank 0, waiting on their stdin for the rendezvous port."""

    procs: list[subprocess.Popen] = field(default_factory=list)

    def tell_port(self, port: int) -> None:
        """Hands every rank the port rank 0's store has bound. Raises Unavailable if a rank has already died."""
        for rank, proc in enumerate(self.procs, start=1):
            if proc.stdin is None or proc.stdin.closed:
                continue
            try:
                proc.stdin.write(f"{port}\n".encode())
                proc.stdin.close()
            except (BrokenPipeError, OSError) as exc:
                raise Unavailable(
                    f"trainer rank {rank} (pid {proc.pid}) exited during start-up (code "
                    f"{proc.poll()}); see its log above"
                ) from exc

    def reap(self, grace: float) -> None:
        """Waits up to `grace` seconds for the ranks to exit (after the stop command), then terminates the rest."""
        for proc in self.procs:
            if proc.stdin is not None and not proc.stdin.closed:
                proc.stdin.close()  # a rank still waiting for the port reads EOF and exits
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                log.warning("trainer rank pid %d did not exit within %.0fs: terminating it", proc.pid, grace)
                proc.terminate()
                proc.wait(10)


def spawn_ranks(world: int, address: str, config_json: str) -> SpawnedRanks:
    """Starts ranks 1..world-1 with the service config in MESHRL_TRAINER_CONFIG_JSON; the port follows later."""
    env = {**os.environ, CONFIG_ENV: config_json}
    spawned = SpawnedRanks()
    for rank in range(1, world):
        cmd = [
            sys.executable,
            "-m",
            "meshrl.trainer.worker",
            "--rank",
            str(rank),
            "--world",
            str(world),
            "--master",
            f"{address}:{PORT_FROM_STDIN}",
        ]
        spawned.procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE))
    return spawned


def read_port(stream: IO[str] | None = None) -> int:
    """The rendezvous port rank 0 writes to this rank's stdin. Raises Unavailable when rank 0 closed it first
    (it failed or stopped during start-up)."""
    line = (sys.stdin if stream is None else stream).readline().strip()
    if not line.isdigit():
        raise Unavailable("trainer rank 0 stopped before telling this rank the rendezvous port; see rank 0's log")
    return int(line)
