"""Checking, when a process starts, that each peer it will call accepts its channel: the TLS
handshake succeeds (right CA, client certificate when the peer requires mTLS, TLS on both sides or
on neither) and the token is the peer's. A misconfigured peer fails at once with the peer's name,
the config field and the fix, instead of as UNAVAILABLE on the first real call minutes later.

Called by the trainer and rollout entry points (their data buffer), the scheduler (data buffer,
trainer, every rollout replica) and the CLI (the scheduler).
"""

from __future__ import annotations

import socket
import time

import grpc

from meshrl.common.errors import ConfigError, Unavailable
from meshrl.common.grpc_channel import ChannelConfig, open_channel

# A method no server implements: the call passes TLS and the token check, then gets UNIMPLEMENTED.
PROBE_METHOD = "/meshrl.common.v1.PeerProbe/Check"


def _listening(address: str, timeout: float = 2.0) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def _probe(address: str, cfg: ChannelConfig, timeout: float) -> grpc.RpcError | None:
    """One probe call; None when the peer accepted TLS and token."""
    channel = open_channel(address, cfg.model_copy(update={"retry_max_attempts": 1}))
    try:
        channel.unary_unary(PROBE_METHOD)(b"", timeout=timeout, wait_for_ready=False)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
            return None
        return exc
    finally:
        channel.close()
    return None


def _token_error(name: str, field: str, address: str, cfg: ChannelConfig, detail: str) -> ConfigError:
    source = f"{field}.auth.token_file" if cfg.auth.token_file else f"${cfg.auth.token_env}"
    if "missing" in detail:
        return ConfigError(
            f"{field}.auth.token_file",
            cfg.auth.token_file,
            f"{name} at {address} requires a token and this process sends none",
            f"set {field}.auth.token_file to the mounted token Secret (or {cfg.auth.token_env})",
        )
    return ConfigError(
        f"{field}.auth.token_file",
        cfg.auth.token_file,
        f"{name} at {address} refused the token from {source}",
        f"use the same token Secret as {name}'s server.auth.token_file",
    )


def _tls_error(name: str, field: str, address: str, cfg: ChannelConfig, detail: str) -> ConfigError:
    tls = cfg.tls
    if tls is None:
        return ConfigError(
            f"{field}.tls",
            None,
            f"{name} at {address} refused a plaintext connection (it serves TLS): {detail}",
            f"set {field}.tls.ca_file to the CA of {name}'s certificate, and {field}.tls.cert_file / key_file "
            "if it requires mutual TLS",
        )
    if "WRONG_VERSION_NUMBER" in detail or "wrong version" in detail.lower():
        return ConfigError(
            f"{field}.tls", "set", f"{name} at {address} serves plaintext, not TLS", f"turn on server.tls on {name}"
        )
    if "CERTIFICATE_VERIFY_FAILED" in detail:
        return ConfigError(
            f"{field}.tls.ca_file",
            tls.ca_file,
            f"{name}'s certificate at {address} is not signed by this CA",
            f"point {field}.tls.ca_file at the CA that signed {name}'s server certificate",
        )
    if tls.cert_file is None:
        return ConfigError(
            f"{field}.tls.cert_file",
            None,
            f"the TLS handshake with {name} at {address} failed ({detail}); it probably requires mutual TLS",
            f"set {field}.tls.cert_file and key_file to a client certificate signed by {name}'s CA",
        )
    return ConfigError(
        f"{field}.tls.cert_file",
        tls.cert_file,
        f"{name} at {address} refused this client certificate ({detail})",
        f"use a client certificate signed by the CA in {name}'s server.tls.ca_file",
    )


def check_peer(
    name: str, cfg: ChannelConfig, *, field: str, address: str | None = None, timeout: float | None = None
) -> str:
    """Waits up to `timeout` (default cfg.check_seconds) for peer `name` (config section `field`) to accept
    this process's channel; returns its address. ConfigError names the field and the fix; Unavailable
    when nothing listens."""
    address = address or cfg.address
    timeout = cfg.check_seconds if timeout is None else timeout
    if not address:
        raise ConfigError(f"{field}.address", None, f"{name}'s address is not configured", "set it to host:port")
    try:
        cfg.auth.token()
        open_channel(address, cfg).close()  # reads the TLS files: a missing one fails here
    except ConfigError as exc:
        raise ConfigError(f"{field}.{exc.field}", exc.value, f"{name}: {exc.problem}", exc.fix) from None
    if timeout <= 0:
        return address
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        error = _probe(address, cfg, timeout=max(1.0, min(5.0, left)))
        if error is None:
            return address
        detail = error.details() or ""
        if error.code() == grpc.StatusCode.UNAUTHENTICATED:
            raise _token_error(name, field, address, cfg, detail)
        if time.monotonic() >= deadline:
            if _listening(address):
                raise _tls_error(name, field, address, cfg, detail)
            raise Unavailable(
                f"{name} does not answer at {address} ({field}.address) within {timeout:.0f}s: {detail}; "
                f"start {name} or fix {field}.address"
            )
        if _listening(address) and error.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() + 1 < deadline:
            # Listening yet refusing: give a starting server one more second, then judge.
            time.sleep(1.0)
            if _probe(address, cfg, timeout=5.0) is None:
                return address
            raise _tls_error(name, field, address, cfg, detail)
        time.sleep(0.2)
