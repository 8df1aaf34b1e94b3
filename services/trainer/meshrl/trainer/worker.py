"""`python -m meshrl.trainer.worker --rank R --world N --master HOST:PORT`: a trainer rank > 0 (TP x PP x DP layout).

Started by rank 0 (`meshrl.trainer.runtime.build_service`) with the service config in the
MESHRL_TRAINER_CONFIG_JSON environment variable; runs rank 0's commands until told to stop.
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
from meshrl.trainer.runtime import make_service


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m meshrl.trainer.worker", description=__doc__.split("\n")[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--master", required=True, help="HOST:PORT of rank 0's rendezvous")
    args = parser.parse_args(argv)
    cfg = TrainerConfig.model_validate_json(os.environ["MESHRL_TRAINER_CONFIG_JSON"])
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s rank{args.rank} %(name)s: %(message)s", stream=sys.stderr
    )
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    exit_with_parent()
    host, port = args.master.rsplit(":", 1)
    init_ranks(
        args.rank, args.world, host, int(port), cfg.data_parallel.backend, cfg.data_parallel.start_timeout_seconds
    )
    bus = CommandBus()
    trainer = make_service(cfg, bus)
    try:
        bus.serve(trainer.run_command)
    finally:
        if trainer.buffer is not None:
            trainer.buffer.close()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
