"""`python -m meshrl.trainer.worker --rank R --world N --master HOST:PORT`: a trainer rank > 0 (TP x PP x DP layout).

Started by rank 0 (`meshrl.trainer.spawn`, spawn mode) with the service config in the
MESHRL_TRAINER_CONFIG_JSON environment variable, before rank 0 has a rendezvous port: with `--master HOST:-`
it imports what it needs, then reads the port from its stdin. Runs rank 0's commands until told to stop. A rank
> 0 started by a launcher such as torchrun (`meshrl.trainer.launched`) runs the same loop, `serve_rank`, from
`python -m meshrl.trainer`.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys

from meshrl.common.service_main import collector_paused
from meshrl.trainer.config import TrainerConfig
from meshrl.trainer.launched import LaunchedRank
from meshrl.trainer.lean_imports import lean
from meshrl.trainer.spawn import CONFIG_ENV, PORT_FROM_STDIN, read_port


def serve_rank(cfg: TrainerConfig, rank: LaunchedRank, *, from_environment: bool, watch_parent: bool) -> None:
    """Joins the world as `rank.rank` (> 0), then runs rank 0's commands until the stop command."""
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s rank{rank.rank} %(name)s: %(message)s", stream=sys.stderr
    )
    with collector_paused():
        with lean():
            import torch
            import torch.distributed as dist

            from meshrl.trainer.dp import CommandBus, exit_with_parent, init_ranks
            from meshrl.trainer.runtime import make_service
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        if watch_parent:
            exit_with_parent()
        port = read_port() if rank.master_port == 0 else rank.master_port
        dp = cfg.data_parallel
        init_ranks(
            rank.rank,
            rank.world,
            rank.master_address,
            port,
            dp.backend,
            dp.start_timeout_seconds,
            local_rank=rank.local_rank,
            from_environment=from_environment,
        )
        bus = CommandBus()
        trainer = make_service(cfg, bus)
    gc.freeze()  # see meshrl.common.service_main: start-up's objects stay out of every collection
    try:
        bus.serve(trainer.run_command)
    finally:
        if trainer.buffer is not None:
            trainer.buffer.close()
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m meshrl.trainer.worker", description=__doc__.split("\n")[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument(
        "--master",
        required=True,
        help=f"HOST:PORT of rank 0's rendezvous; HOST:{PORT_FROM_STDIN} reads PORT from stdin",
    )
    args = parser.parse_args(argv)
    cfg = TrainerConfig.model_validate_json(os.environ[CONFIG_ENV])
    host, port = args.master.rsplit(":", 1)
    rank = LaunchedRank(
        rank=args.rank,
        world=args.world,
        local_rank=args.rank,
        master_address=host,
        master_port=0 if port == PORT_FROM_STDIN else int(port),
    )
    serve_rank(cfg, rank, from_environment=False, watch_parent=True)


if __name__ == "__main__":
    main()
