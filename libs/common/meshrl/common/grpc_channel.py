"""Client side of meshrl's gRPC: channels with keepalive, message limits, retries on
UNAVAILABLE, TLS / token, trace propagation; calls with deadlines that raise typed errors.

Every client of a meshrl service (scheduler → services, services → data buffer) opens its
channel with `open_channel` and calls through `call`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
import pydantic
from grpc_health.v1 import health_pb2, health_pb2_grpc

from meshrl.common import telemetry
from meshrl.common.config import StrictModel
from meshrl.common.errors import DeadlineExceeded, Unavailable, from_rpc_error
from meshrl.common.security import AuthConfig, TLSConfig, channel_credentials, token_client_interceptor

R = TypeVar("R")
MiB = 1 << 20


class ChannelConfig(StrictModel):
    max_message_bytes: int = pydantic.Field(64 * MiB, ge=MiB)
    keepalive_time_ms: int = pydantic.Field(30_000, ge=1000)
    keepalive_timeout_ms: int = pydantic.Field(10_000, ge=1000)
    retry_max_attempts: int = pydantic.Field(5, ge=1, le=5, description="attempts of a call that got UNAVAILABLE")
    retry_initial_backoff_s: float = pydantic.Field(0.2, gt=0)
    retry_max_backoff_s: float = pydantic.Field(3.0, gt=0)
    tls: TLSConfig | None = None
    auth: AuthConfig = pydantic.Field(default_factory=AuthConfig)


def _service_config(cfg: ChannelConfig) -> str:
    policy = {
        "maxAttempts": cfg.retry_max_attempts,
        "initialBackoff": f"{cfg.retry_initial_backoff_s}s",
        "maxBackoff": f"{cfg.retry_max_backoff_s}s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"],
    }
    config: dict[str, Any] = {"methodConfig": [{"name": [{}], "waitForReady": True}]}
    if cfg.retry_max_attempts > 1:
        config["methodConfig"][0]["retryPolicy"] = policy
    return json.dumps(config)


def open_channel(address: str, cfg: ChannelConfig | None = None) -> grpc.Channel:
    cfg = cfg or ChannelConfig()
    options = [
        ("grpc.max_send_message_length", cfg.max_message_bytes),
        ("grpc.max_receive_message_length", cfg.max_message_bytes),
        ("grpc.keepalive_time_ms", cfg.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", cfg.keepalive_timeout_ms),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", _service_config(cfg)),
    ]
    if cfg.tls:
        if cfg.tls.server_name_override:
            options.append(("grpc.ssl_target_name_override", cfg.tls.server_name_override))
        channel = grpc.secure_channel(address, channel_credentials(cfg.tls), options=options)
    else:
        channel = grpc.insecure_channel(address, options=options)
    interceptors = list(telemetry.client_interceptors())
    token = cfg.auth.token()
    if token:
        interceptors.append(token_client_interceptor(token))
    return grpc.intercept_channel(channel, *interceptors) if interceptors else channel


def call(method: Callable[..., R], request: Any, *, timeout: float, **kwargs: Any) -> R:
    """Calls a unary RPC with a deadline; a failed call raises the typed error the server raised."""
    try:
        return method(request, timeout=timeout, **kwargs)
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None


def wait_until_serving(channel: grpc.Channel, *, timeout: float, service: str = "") -> None:
    """Polls the standard health service until SERVING or the deadline passes."""
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=min(2.0, timeout))
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.RpcError as exc:
            last = exc
        time.sleep(0.1)
    if isinstance(last, grpc.RpcError) and last.code() == grpc.StatusCode.UNAVAILABLE:
        raise Unavailable(f"service '{service or 'server'}' did not come up within {timeout:.0f}s: {last.details()}")
    raise DeadlineExceeded(f"service '{service or 'server'}' was not SERVING within {timeout:.0f}s")
