"""Process set-up shared by the trainer's entry points: the world of TP x PP x DP ranks, the core, the data
buffer client and the TrainerService of this rank. Called by `__main__` (rank 0) and `worker` (others).
"""

from __future__ import annotations

import logging
import subprocess

from meshrl.common.net import free_port
from meshrl.trainer.config import TrainerConfig
from meshrl.trainer.core import TrainerCore
from meshrl.trainer.dp import CommandBus, init_ranks, spawn_workers
from meshrl.trainer.launched import LaunchedRank
from meshrl.trainer.service import TrainerService

log = logging.getLogger(__name__)


def make_service(cfg: TrainerConfig, bus: CommandBus | None) -> TrainerService:
    core = TrainerCore(
        micro_batch_tokens=cfg.defaults.micro_batch_tokens,
        temperature=cfg.defaults.temperature,
        atomic_steps=cfg.atomic_steps,
        tensor_parallel=cfg.parallel.tensor_parallel,
        pipeline_parallel=cfg.parallel.pipeline_parallel,
    )
    buffer = None
    peer = cfg.databuffer_peer()
    if peer is not None:
        from meshrl.common.databuffer_client import DataBufferClient
        from meshrl.common.peers import check_peer

        check_peer("the data buffer", peer, field="databuffer")  # a misconfigured channel fails at start
        buffer = DataBufferClient(peer.address, peer)
    return TrainerService(cfg, core, buffer, bus)


def build_service(
    cfg: TrainerConfig, launched: LaunchedRank | None = None
) -> tuple[TrainerService, list[subprocess.Popen]]:
    """Rank 0: starts ranks 1..N-1 (N = data x tensor x pipeline parallel > 1), joins the world, returns its
    service. `launched`: a launcher (torchrun) started every rank; rank 0 only joins the world it set up."""
    dp = cfg.data_parallel
    world = cfg.world_size
    workers: list[subprocess.Popen] = []
    bus = None
    if launched is not None and world > 1:
        init_ranks(0, world, launched.master_address, launched.master_port, dp.backend, dp.start_timeout_seconds,
                   local_rank=launched.local_rank, from_environment=True)  # fmt: skip
        bus = CommandBus()
    elif world > 1:
        port = dp.master_port or free_port(dp.master_address)
        workers = spawn_workers(world, dp.master_address, port, cfg.model_dump_json())
        init_ranks(0, world, dp.master_address, port, dp.backend, dp.start_timeout_seconds)
        bus = CommandBus()
    return make_service(cfg, bus), workers


def shutdown(trainer: TrainerService, workers: list[subprocess.Popen], grace: float = 30.0) -> None:
    """Stops the worker ranks (stop command, then SIGTERM), closes the buffer client."""
    try:
        trainer.stop_workers()
    except Exception as exc:  # noqa: BLE001 - shutting down regardless
        log.warning("stopping trainer ranks: %s", exc)
    for proc in workers:
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.terminate()
            proc.wait(10)
    if trainer.buffer is not None:
        trainer.buffer.close()
