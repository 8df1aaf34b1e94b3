"""`python -m meshrl.trainer`: the trainer service — start the data-parallel ranks, serve gRPC on rank 0,
and on SIGTERM stop the ranks and exit. Under a launcher (`torchrun ... -m meshrl.trainer`, see
`meshrl.trainer.launched`) every rank runs this: rank 0 serves, ranks > 0 join and run rank 0's commands.

In spawn mode rank 0 starts the other ranks first (`meshrl.trainer.spawn`), so that they import in parallel with
it; megatron-core is imported lean (`meshrl.trainer.lean_imports`).

Config: `--config FILE`, `--set key=value`, MESHRL_* environment (see meshrl.trainer.config).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from meshrl.common.config import parse_service_args
from meshrl.common.grpc_server import EXIT_WITH_PARENT_ENV
from meshrl.common.service_main import Hosted, run_service
from meshrl.trainer.config import TrainerConfig
from meshrl.trainer.launched import launched_rank
from meshrl.trainer.lean_imports import lean
from meshrl.trainer.spawn import SpawnedRanks, spawn_ranks

log = logging.getLogger("meshrl.trainer")


def main(argv: Sequence[str] | None = None) -> None:
    cfg = parse_service_args(
        TrainerConfig,
        argv,
        prog="python -m meshrl.trainer",
        description="The trainer: megatron-core policy / reference / critic models, log-probs, RL train steps.",
    )

    launched = launched_rank(cfg.data_parallel.launcher, cfg.world_size)
    if launched is not None and launched.rank > 0:
        from meshrl.trainer.worker import serve_rank

        # a rank a Ray actor started (MESHRL_EXIT_WITH_PARENT=1) ends with its actor, as rank 0 does
        watch = os.environ.get(EXIT_WITH_PARENT_ENV) == "1"
        serve_rank(cfg, launched, from_environment=True, watch_parent=watch)
        return

    spawned = SpawnedRanks()
    if launched is None and cfg.world_size > 1:  # before the heavy imports below: the ranks import alongside
        spawned = spawn_ranks(cfg.world_size, cfg.data_parallel.master_address, cfg.model_dump_json())

    def build() -> Hosted:
        with lean():
            import torch

            from meshrl.trainer.runtime import build_service, shutdown
            from meshrl.trainer.server import service
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        trainer, ranks = build_service(cfg, launched, spawned)
        log.info(
            "trainer: %d rank(s), %s, on %s", trainer.core.world, trainer.core.layout.describe(), trainer.core.device
        )
        return Hosted([service(trainer)], stopped=lambda: shutdown(trainer, ranks))

    try:
        run_service("trainer", cfg, build)
    finally:
        spawned.reap(grace=5.0)  # ranks of a start that failed or was stopped; after a stop they are gone


if __name__ == "__main__":
    main()
