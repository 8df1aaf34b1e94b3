"""`python -m meshrl.rollout`: one rollout replica — load the engine and the job's current weights,
serve gRPC, register in the replica registry, and on SIGTERM drain before stopping.

Config: `--config FILE`, `--set key=value`, MESHRL_* environment (see meshrl.rollout.config).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence

from grpc_health.v1 import health_pb2

from meshrl.common import telemetry
from meshrl.common.config import parse_service_args
from meshrl.common.grpc_server import EXIT_WITH_PARENT_ENV, RunningServer, start_server
from meshrl.common.registry import Heartbeat, ReplicaRegistry
from meshrl.rollout.config import RolloutConfig
from meshrl.rollout.engine import create_engine
from meshrl.rollout.initial_weights import load_initial_weights
from meshrl.rollout.replica import RolloutReplica
from meshrl.rollout.server import service

log = logging.getLogger("meshrl.rollout")


def advertised_address(cfg: RolloutConfig, port: int) -> str:
    if cfg.advertise_address:
        return cfg.advertise_address
    host = cfg.server.host
    if host in ("0.0.0.0", "::", ""):
        host = os.environ.get("POD_IP") or "127.0.0.1"
    return f"{host}:{port}"


def _wait_for_stop() -> None:
    """Blocks until SIGTERM / SIGINT (or the launching parent is gone, when MESHRL_EXIT_WITH_PARENT=1)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stop.set())
    parent = os.getppid() if os.environ.get(EXIT_WITH_PARENT_ENV) == "1" else None
    while not stop.wait(0.5):
        if parent is not None and os.getppid() != parent:
            log.warning("parent process %d is gone: stopping", parent)
            return


def serve(cfg: RolloutConfig) -> None:
    engine = create_engine(cfg.engine)
    databuffer = None
    if cfg.databuffer_address:
        from meshrl.common.databuffer_client import DataBufferClient

        databuffer = DataBufferClient(cfg.databuffer_address)
    replica = RolloutReplica(
        engine,
        replica_id=cfg.replica_id,
        capacity=cfg.effective_capacity,
        databuffer=databuffer,
        buffer_wait_s=cfg.databuffer_wait_seconds,
        limits=cfg.limits,
    )
    registry = None
    if cfg.registry.redis_url:
        registry = ReplicaRegistry(
            cfg.registry.redis_url, namespace=cfg.registry.namespace, ttl_seconds=cfg.registry.ttl_seconds
        )
    heartbeat: Heartbeat | None = None
    running: RunningServer | None = None
    try:
        # Never serve stale weights: the job's current version is loaded before the replica takes traffic.
        load_initial_weights(replica, cfg.weights.path, registry)
        running = start_server(cfg.server, [service(replica, cfg.paths)])
        address = advertised_address(cfg, running.port)
        load_initial_weights(replica, cfg.weights.path, registry)  # a version published while we started
        replica.mark_serving()
        if registry is not None:

            def info():
                if registry.drain_requested(cfg.replica_id):
                    replica.start_draining()
                return replica.info(address)

            heartbeat = Heartbeat(registry, info, cfg.registry.heartbeat_seconds)
            heartbeat.start()
        log.info("rollout replica %s serving %s (%s) at %s, weights v%d", cfg.replica_id, engine.model_path,
                 engine.name, address, engine.weight_version)  # fmt: skip
        _wait_for_stop()
        log.info("draining: in-flight generation gets up to %.0fs", cfg.drain_timeout_s)
        replica.start_draining()
        for name in ["", *running.names]:  # load balancers and probes stop sending work too
            running.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        if heartbeat is not None:
            heartbeat.beat()  # routers stop sending work now
        if not replica.wait_idle(cfg.drain_timeout_s):
            log.warning("drain timed out; stopping with generation in flight")
    finally:
        if running is not None:
            running.stop(cfg.server.grace_seconds)
        if heartbeat is not None:
            heartbeat.stop(deregister_id=cfg.replica_id)
        engine.shutdown()
        if databuffer is not None:
            databuffer.close()
        telemetry.shutdown_telemetry()


def main(argv: Sequence[str] | None = None) -> None:
    cfg = parse_service_args(
        RolloutConfig,
        argv,
        prog="python -m meshrl.rollout",
        description="A rollout replica: generation with per-token log-probs on transformers, SGLang or vLLM.",
    )
    logging.basicConfig(level=logging.INFO, format=telemetry.LOG_FORMAT, stream=sys.stderr)
    telemetry.install_log_correlation()
    telemetry.setup_telemetry("rollout", cfg.telemetry, instance=cfg.replica_id)
    serve(cfg)


if __name__ == "__main__":
    main()
