"""`python -m meshrl.trainer.worker --rank R --world N --master HOST:PORT`: a trainer rank > 0 (TP x PP x DP layout).

Started by rank 0 (`meshrl.trainer.runtime.build_service`, spawn mode) with the service config in the
MESHRL_TRAINER_CONFIG_JSON environment variable; runs rank 0's commands until told to stop. A rank > 0
started by a launcher such as torchrun (`meshrl.trainer.launched`) runs the same loop, `serve_rank`,
from `python -m meshrl.trainer`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import torch
import torch.distributed as dist

from meshrl.trainer.config import TrainerConfig
from meshrl.trainer.dp import CommandBus, exit_with_parent, init_ranks
from meshrl.trainer.launched import LaunchedRank
from meshrl.trainer.runtime import make_service


def serve_rank(cfg: TrainerConfig, rank: LaunchedRank, *, from_environment: bool, watch_parent: bool) -> None:
    """Joins the world as `rank.rank` (> 0), then runs rank 0's commands until the stop command."""
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s rank{rank.rank} %(name)s: %(message)s", stream=sys.stderr
    )
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    if watch_parent:
        exit_with_parent()
    dp = cfg.data_parallel
    init_ranks(rank.rank, rank.world, rank.master_address, rank.master_port, dp.backend, dp.start_timeout_seconds,
               local_rank=rank.local_rank, from_environment=from_environment)  # fmt: skip
    bus = CommandBus()
    trainer = make_service(cfg, bus)
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
    parser.add_argument("--master", required=True, help="HOST:PORT of rank 0's rendezvous")
    args = parser.parse_args(argv)
    cfg = TrainerConfig.model_validate_json(os.environ["MESHRL_TRAINER_CONFIG_JSON"])
    host, port = args.master.rsplit(":", 1)
    rank = LaunchedRank(rank=args.rank, world=args.world, local_rank=args.rank, master_address=host,
                        master_port=int(port))  # fmt: skip
    serve_rank(cfg, rank, from_environment=False, watch_parent=True)


if __name__ == "__main__":
    main()
