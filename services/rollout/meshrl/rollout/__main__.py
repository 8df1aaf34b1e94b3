"""`python -m meshrl.rollout`: one rollout replica — load the engine and the job's current weights,
serve gRPC, register in the replica registry, and on SIGTERM drain before stopping.

Config: `--config FILE`, `--set key=value`, MESHRL_* environment (see meshrl.rollout.config).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from grpc_health.v1 import health_pb2

from meshrl.common.config import parse_service_args
from meshrl.common.grpc_server import RunningServer
from meshrl.common.registry import Heartbeat, ReplicaRegistry
from meshrl.common.service_main import Hosted, run_service
from meshrl.rollout.config import RolloutConfig
from meshrl.rollout.engine_factory import create_engine
from meshrl.rollout.initial_weights import load_initial_weights
from meshrl.rollout.replica import RolloutReplica
from meshrl.rollout.server import service

log = logging.getLogger("meshrl.rollout")


def advertised_address(cfg: RolloutConfig, running: RunningServer) -> str:
    """What routers dial: advertise_address, else the server's advertised host and bound port."""
    return cfg.advertise_address or running.address


class ReplicaLife:
    """A replica around its server's life: weights before traffic, registration, drain, release."""

    def __init__(self, cfg: RolloutConfig) -> None:
        self.cfg = cfg
        self.databuffer = None
        peer = cfg.databuffer_peer()
        if peer is not None:
            from meshrl.common.databuffer_client import DataBufferClient
            from meshrl.common.peers import check_peer

            check_peer("the data buffer", peer, field="databuffer")  # a misconfigured channel fails at start
            self.databuffer = DataBufferClient(peer.address, peer)
        self.engine = create_engine(cfg.engine)
        self.replica = RolloutReplica(
            self.engine,
            replica_id=cfg.replica_id,
            capacity=cfg.effective_capacity,
            databuffer=self.databuffer,
            buffer_wait_s=cfg.databuffer_wait_seconds,
            limits=cfg.limits,
        )
        self.registry = None
        if cfg.registry.redis_url:
            reg = cfg.registry
            self.registry = ReplicaRegistry(
                reg.redis_url, namespace=reg.namespace, ttl_seconds=reg.ttl_seconds, token=cfg.server.auth.token()
            )  # entries signed with it
        self.heartbeat: Heartbeat | None = None
        try:  # never serve stale weights: the job's current version is loaded before the replica takes traffic
            load_initial_weights(self.replica, cfg.weights.path, self.registry)
        except BaseException:
            self.stopped()
            raise

    def hosted(self) -> Hosted:
        return Hosted(
            [service(self.replica, self.cfg.paths)], started=self.started, draining=self.draining, stopped=self.stopped
        )

    def started(self, running: RunningServer) -> None:
        cfg, replica = self.cfg, self.replica
        address = advertised_address(cfg, running)
        load_initial_weights(replica, cfg.weights.path, self.registry)  # a version published while we started
        replica.mark_serving()
        if self.registry is not None:
            registry = self.registry

            def info():
                if registry.drain_requested(cfg.replica_id):
                    replica.start_draining()
                return replica.info(address)

            self.heartbeat = Heartbeat(registry, info, cfg.registry.heartbeat_seconds)
            self.heartbeat.start()
        log.info(
            "rollout replica %s serving %s (%s) at %s, weights v%d",
            cfg.replica_id,
            self.engine.model_path,
            self.engine.name,
            address,
            self.engine.weight_version,
        )

    def draining(self, running: RunningServer) -> None:
        log.info("draining: in-flight generation gets up to %.0fs", self.cfg.drain_timeout_s)
        self.replica.start_draining()
        for name in ["", *running.names]:  # load balancers and probes stop sending work too
            running.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        if self.heartbeat is not None:
            self.heartbeat.beat()  # routers stop sending work now
        if not self.replica.wait_idle(self.cfg.drain_timeout_s):
            log.warning("drain timed out; stopping with generation in flight")

    def stopped(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop(deregister_id=self.cfg.replica_id)
        self.engine.shutdown()
        if self.databuffer is not None:
            self.databuffer.close()


def main(argv: Sequence[str] | None = None) -> None:
    cfg = parse_service_args(
        RolloutConfig,
        argv,
        prog="python -m meshrl.rollout",
        description="A rollout replica: generation with per-token log-probs on transformers, SGLang or vLLM.",
    )
    run_service("rollout", cfg, lambda: ReplicaLife(cfg).hosted(), instance=cfg.replica_id)


if __name__ == "__main__":
    main()
