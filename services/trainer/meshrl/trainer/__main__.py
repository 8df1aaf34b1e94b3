"""`python -m meshrl.trainer`: the trainer service — start the data-parallel ranks, serve gRPC on rank 0,
and on SIGTERM stop the ranks and exit.

Config: `--config FILE`, `--set key=value`, MESHRL_* environment (see meshrl.trainer.config).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import torch

from meshrl.common import telemetry
from meshrl.common.config import parse_service_args
from meshrl.common.grpc_server import start_server, wait_for_termination
from meshrl.trainer.config import TrainerConfig
from meshrl.trainer.runtime import build_service, shutdown
from meshrl.trainer.server import service

log = logging.getLogger("meshrl.trainer")


def main(argv: Sequence[str] | None = None) -> None:
    cfg = parse_service_args(
        TrainerConfig,
        argv,
        prog="python -m meshrl.trainer",
        description="The trainer: megatron-core policy / reference / critic models, log-probs, RL train steps.",
    )
    logging.basicConfig(level=logging.INFO, format=telemetry.LOG_FORMAT, stream=sys.stderr)
    telemetry.install_log_correlation()
    telemetry.setup_telemetry("trainer", cfg.telemetry)
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    trainer, workers = build_service(cfg)
    running = start_server(cfg.server, [service(trainer)])
    log.info("trainer serving on %s (%d data-parallel rank(s), %s)", running.address, trainer.core.world,
             trainer.core.device)  # fmt: skip
    wait_for_termination(running, cfg.server.grace_seconds, on_stop=lambda: shutdown(trainer, workers))


if __name__ == "__main__":
    main()
