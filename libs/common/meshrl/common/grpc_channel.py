"""Client side of meshrl's gRPC: the channel config of one peer (address, TLS / mTLS, token file,
keepalive, message limits, retries on UNAVAILABLE), the one helper that opens every channel from it,
and calls with deadlines that raise typed errors.

Every client of a meshrl service (scheduler → services, services → data buffer, router → replicas,
CLI → scheduler) opens its channel with `open_channel` and calls through `call`; `meshrl.common.peers`
checks at start that a peer accepts the channel (TLS and token) and names the fix when it does not.
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
from meshrl.common.errors import ConfigError, DeadlineExceeded, Unavailable, from_rpc_error
from meshrl.common.security import AuthConfig, ClientTLSConfig, channel_credentials, token_client_interceptor

R = TypeVar("R")
MiB = 1 << 20


class ChannelConfig(StrictModel):
    """How this process reaches one peer. Filled from the service's YAML, MESHRL_* variables
    (e.g. MESHRL_DATABUFFER__TLS__CA_FILE) or files mounted from Kubernetes Secrets."""

    address: str | None = pydantic.Field(None, description="host:port of the peer")
    max_message_bytes: int = pydantic.Field(64 * MiB, ge=MiB)
    check_seconds: float = pydantic.Field(
        60.0, ge=0, description="at start, wait this long for the peer to accept TLS and token (0: no check)"
    )
    keepalive_time_ms: int = pydantic.Field(30_000, ge=1000)
    keepalive_timeout_ms: int = pydantic.Field(10_000, ge=1000)
    retry_max_attempts: int = pydantic.Field(5, ge=1, le=5, description="attempts of a call that got UNAVAILABLE")
    retry_initial_backoff_s: float = pydantic.Field(0.2, gt=0)
    retry_max_backoff_s: float = pydantic.Field(3.0, gt=0)
    tls: ClientTLSConfig | None = pydantic.Field(
        None, description="TLS to the peer: ca_file (verifies the peer), cert_file + key_file (mTLS)"
    )
    auth: AuthConfig = pydantic.Field(default_factory=AuthConfig)

    @pydantic.field_validator("tls", mode="before")
    @classmethod
    def _tls_from_model(cls, value: Any) -> Any:
        # A server's TLSConfig (same field names) may be reused as the client side of the same PKI.
        return value.model_dump() if isinstance(value, pydantic.BaseModel) else value


def peer_channel(channel: ChannelConfig, shortcut: str | None, field: str) -> ChannelConfig | None:
    """A peer's channel config from its section and the older `<peer>_address` shortcut (None: no peer)."""
    if shortcut and channel.address and shortcut != channel.address:
        raise ConfigError(
            f"{field}.address", channel.address, f"it disagrees with {field}_address={shortcut!r}", "set only one"
        )
    address = channel.address or shortcut
    return channel.model_copy(update={"address": address}) if address else None


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


def open_channel(address: str | None, cfg: ChannelConfig | None = None) -> grpc.Channel:
    """The channel to one peer at `address` (default: cfg.address) with cfg's TLS, token and options."""
    cfg = cfg or ChannelConfig()
    address = address or cfg.address
    if not address:
        raise ConfigError("address", address, "no peer address is configured", "set the peer's address (host:port)")
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
    """Calls a unary RPC with a deadline; a failed call raises the typed error the server raised (and a call
    on a channel its client already closed raises `Unavailable`, as one cut off by the close does)."""
    try:
        return method(request, timeout=timeout, **kwargs)
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None
    except ValueError as exc:
        if "closed channel" not in str(exc):
            raise
        raise Unavailable(
            f"the channel was closed before the call ({exc}): the peer's process exited, or the client is shutting down"
        ) from None


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
