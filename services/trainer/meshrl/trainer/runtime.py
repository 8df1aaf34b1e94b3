"""Process set-up shared by the trainer's entry points: the world of TP x PP x DP ranks, the core, the data
buffer client and the TrainerService of this rank. Called by `__main__` (rank 0) and `worker` (others).
"""

from __future__ import annotations

import logging

from meshrl.trainer.config import TrainerConfig
from meshrl.trainer.core import TrainerCore
from meshrl.trainer.dp import CommandBus, init_ranks, rank_zero_store
from meshrl.trainer.launched import LaunchedRank
from meshrl.trainer.service import TrainerService
from meshrl.trainer.spawn import SpawnedRanks, spawn_ranks

log = logging.getLogger(__name__)


def make_service(cfg: TrainerConfig, bus: CommandBus | None) -> TrainerService:
    core = TrainerCore(
        micro_batch_tokens=cfg.defaults.micro_batch_tokens,
        atomic_steps=cfg.atomic_steps,
        tensor_parallel=cfg.parallel.tensor_parallel,
        pipeline_parallel=cfg.parallel.pipeline_parallel,
        single_thread_below_gflop=cfg.single_thread_below_gflop,
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
    cfg: TrainerConfig, launched: LaunchedRank | None = None, spawned: SpawnedRanks | None = None
) -> tuple[TrainerService, SpawnedRanks]:
    """Rank 0: joins the world of N = data x tensor x pipeline parallel ranks (N > 1), returns its service and the
    ranks it started. `spawned`: ranks 1..N-1 already started (by `__main__`, before its heavy imports), else
    started here; they learn the port once this rank's store has bound it. `launched`: a launcher (torchrun)
    started every rank; rank 0 only joins the world it set up."""
    dp = cfg.data_parallel
    world = cfg.world_size
    spawned = spawned or SpawnedRanks()
    bus = None
    if launched is not None and world > 1:
        init_ranks(
            0,
            world,
            launched.master_address,
            launched.master_port,
            dp.backend,
            dp.start_timeout_seconds,
            local_rank=launched.local_rank,
            from_environment=True,
        )
        bus = CommandBus()
    elif world > 1:
        if not spawned.procs:
            spawned = spawn_ranks(world, dp.master_address, cfg.model_dump_json())
        store = rank_zero_store(dp.master_address, dp.master_port, world, dp.start_timeout_seconds)
        spawned.tell_port(store.port)
        init_ranks(0, world, dp.master_address, store.port, dp.backend, dp.start_timeout_seconds, store=store)
        bus = CommandBus()
    return make_service(cfg, bus), spawned


def shutdown(trainer: TrainerService, spawned: SpawnedRanks, grace: float = 30.0) -> None:
    """Stops the worker ranks (stop command; those still up after `grace` seconds get SIGTERM), closes the
    buffer client."""
    try:
        trainer.stop_workers()
    except Exception as exc:  # noqa: BLE001 - shutting down regardless
        log.warning("stopping trainer ranks: %s", exc)
    spawned.reap(grace)
    if trainer.buffer is not None:
        trainer.buffer.close()
