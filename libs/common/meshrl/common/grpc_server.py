"""Starting and stopping a meshrl gRPC server: the same options, interceptors, health
service and reflection for every service, and a graceful stop on SIGTERM / SIGINT.

Each service's `__main__` hands its servicers to `meshrl.common.service_main.run_service`, which calls
`start_server` and stops the server on SIGTERM.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pydantic
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from meshrl.common import telemetry
from meshrl.common.config import StrictModel
from meshrl.common.errors import ConfigError
from meshrl.common.grpc_errors import ErrorMappingInterceptor
from meshrl.common.light_calls import LightCallsInterceptor
from meshrl.common.long_streams import LongStreamsInterceptor
from meshrl.common.security import AuthConfig, TLSConfig, TokenAuthInterceptor, server_credentials

log = logging.getLogger(__name__)
MiB = 1 << 20
EXIT_WITH_PARENT_ENV = "MESHRL_EXIT_WITH_PARENT"


class ServerConfig(StrictModel):
    host: str = pydantic.Field("127.0.0.1", description="address to bind; 127.0.0.1 (loopback) unless told otherwise")
    advertise_host: str | None = pydantic.Field(
        None,
        description="address peers dial (default: server.host; for 0.0.0.0 / :: the POD_IP variable, else "
        "this host's outbound interface address)",
    )
    port: int = pydantic.Field(0, ge=0, le=65535, description="TCP port; 0 picks a free one")
    max_workers: int = pydantic.Field(16, ge=1, description="threads serving RPCs")
    max_long_streams: int | None = pydantic.Field(
        None,
        ge=1,
        description="most long-lived streams (WatchJob, reflection) at once, each holding a thread; "
        "more are refused with RESOURCE_EXHAUSTED (default: half of max_workers, the rest stay for calls)",
    )
    max_message_bytes: int = pydantic.Field(64 * MiB, ge=MiB, description="largest message sent or received")
    grace_seconds: float = pydantic.Field(10.0, ge=0, description="time in-flight RPCs get on SIGTERM")
    keepalive_time_ms: int = pydantic.Field(30_000, ge=1000)
    keepalive_timeout_ms: int = pydantic.Field(10_000, ge=1000)
    port_file: str | None = pydantic.Field(None, description="write the bound port to this file once serving")
    address_file: str | None = pydantic.Field(
        None, description="write the advertised host:port to this file once serving (launchers read it)"
    )
    health_port: int | None = pydantic.Field(
        None, ge=0, le=65535, description="extra plaintext port serving only grpc.health.v1 (probes cannot speak TLS)"
    )
    tls: TLSConfig | None = None
    auth: AuthConfig = pydantic.Field(default_factory=AuthConfig)
    require_auth: bool = pydantic.Field(False, description="refuse calls without the token (also on if a token is set)")


WILDCARDS = ("0.0.0.0", "::", "", "[::]")


def _outbound_address() -> str | None:
    """The address of the interface this host routes through (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: only selects a route
            return s.getsockname()[0]
    except OSError:
        return None


def advertised_host(cfg: ServerConfig) -> str:
    """The host peers dial: config first, then the address the bind resolves to; never a wildcard."""
    if cfg.advertise_host:
        if cfg.advertise_host in WILDCARDS:
            raise ConfigError(
                "server.advertise_host", cfg.advertise_host, "a wildcard cannot be dialled", "give a routable address"
            )
        return cfg.advertise_host
    if cfg.host not in WILDCARDS:
        return cfg.host
    found = os.environ.get("POD_IP") or _outbound_address()
    if not found:
        raise ConfigError(
            "server.advertise_host",
            None,
            f"bound to {cfg.host!r} and no routable address was found",
            "set server.advertise_host (or POD_IP) to the address peers reach this host at",
        )
    return found


def server_options(cfg: ServerConfig) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_send_message_length", cfg.max_message_bytes),
        ("grpc.max_receive_message_length", cfg.max_message_bytes),
        ("grpc.keepalive_time_ms", cfg.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", cfg.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
        ("grpc.so_reuseport", 0),
    ]


@dataclass
class Service:
    """One servicer to register: `add` is the generated `add_XServicer_to_server`."""

    add: Callable[[Any, grpc.Server], None]
    servicer: Any
    name: str  # full service name, e.g. "meshrl.databuffer.v1.DataBuffer"


@dataclass
class RunningServer:
    server: grpc.Server
    port: int
    address: str
    health: health.HealthServicer
    names: list[str] = field(default_factory=list)
    health_server: grpc.Server | None = None
    health_port: int | None = None
    _stopped: threading.Event = field(default_factory=threading.Event)

    def stop(self, grace: float | None = None) -> None:
        """Reports NOT_SERVING (so balancers drain), then stops accepting and waits up to `grace`."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.health.enter_graceful_shutdown()
        self.server.stop(grace).wait()
        if self.health_server is not None:
            self.health_server.stop(0).wait()

    def wait(self) -> None:
        self.server.wait_for_termination()


def start_server(
    cfg: ServerConfig, services: Sequence[Service], interceptors: Sequence[Any] = (), tokens: Sequence[str] = ()
) -> RunningServer:
    """`tokens`: further bearer tokens the server admits beside `cfg.auth`'s (the scheduler's submitters)."""
    chain: list[Any] = [LightCallsInterceptor(), telemetry.server_interceptor(), telemetry.rpc_metrics_interceptor()]
    admitted = [t for t in (cfg.auth.token(), *tokens) if t]
    if cfg.require_auth or admitted:
        if not admitted:
            raise ConfigError(
                "server.require_auth", True, "no token is configured", f"set {cfg.auth.token_env} or auth.token_file"
            )
        chain.append(TokenAuthInterceptor(*admitted))
    chain += [LongStreamsInterceptor(cfg.max_long_streams or max(1, cfg.max_workers // 2))]
    chain += [*interceptors, ErrorMappingInterceptor()]
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=cfg.max_workers, thread_name_prefix="grpc"),
        interceptors=chain,
        options=server_options(cfg),
        maximum_concurrent_rpcs=None,
    )
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [s.name for s in services]
    for s in services:
        s.add(s.servicer, server)
    reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    bind = f"{cfg.host}:{cfg.port}"
    port = server.add_secure_port(bind, server_credentials(cfg.tls)) if cfg.tls else server.add_insecure_port(bind)
    server.start()
    for name in ["", *names]:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    address = f"{advertised_host(cfg)}:{port}"
    health_server, health_port = None, None
    if cfg.health_port is not None:
        health_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="health"))
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, health_server)
        health_port = health_server.add_insecure_port(f"{cfg.host}:{cfg.health_port}")
        health_server.start()
    for path, text in ((cfg.address_file, address), (cfg.port_file, str(port))):  # the port file last
        if path:
            tmp = Path(path + ".tmp")
            tmp.write_text(text)
            tmp.replace(path)
    log.info("serving %s on %s%s", ", ".join(names), address, " (TLS)" if cfg.tls else "")
    return RunningServer(server, port, address, health_servicer, names, health_server, health_port)
