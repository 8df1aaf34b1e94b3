"""What a service's config leaves open to its network, said once at start: no token (any process that reaches
the port may call every RPC), a wildcard bind address, a wildcard bind without TLS, a Prometheus endpoint on
every interface, and `paths.roots: []` (calls may name any path). Each warning names the setting that closes it.

`meshrl.common.service_main.run_service` logs `exposure_warnings(cfg)` for every service; docs/security.md
lists the settings of a secured deployment.
"""

from __future__ import annotations

from typing import Any

from meshrl.common.errors import MeshrlError
from meshrl.common.grpc_server import WILDCARDS


def exposure_warnings(cfg: Any, address: str | None = None, more_tokens: bool = False) -> list[str]:
    """The warnings for a service config with `server` (ServerConfig) and optionally `telemetry` and `paths`;
    `address`: where it serves (default: server.host and server.port); `more_tokens`: the server admits tokens
    besides server.auth's (the scheduler's submitters), so it requires one."""
    server = cfg.server
    address = address or f"{server.host}:{server.port}"
    out = []
    try:
        token = server.auth.token()
    except MeshrlError:
        token = None  # a missing token file fails the start on its own, naming the file
    if not token and not server.require_auth and not more_tokens:
        out.append(
            f"serving without a token: any process that reaches {address} may call "
            f"every RPC. Set the environment variable {server.auth.token_env} (server.auth.token_env) or "
            "server.auth.token_file, and server.require_auth: true"
        )
    if server.host in WILDCARDS:
        tls = "" if server.tls else " without TLS (set server.tls: cert_file, key_file, ca_file)"
        out.append(
            f"server.host = {server.host!r} binds every interface{tls}; bind one address (server.host) unless "
            "the service must be reached from other hosts"
        )
    telemetry = getattr(cfg, "telemetry", None)
    if telemetry is not None and telemetry.prometheus_port is not None and telemetry.prometheus_host in WILDCARDS:
        out.append(
            f"telemetry.prometheus_host = {telemetry.prometheus_host!r} serves /metrics on every interface without "
            "authentication; set it to 127.0.0.1 unless a scraper on another host reads it"
        )
    paths = getattr(cfg, "paths", None)
    if paths is not None and not paths.roots:
        out.append("paths.roots is empty: calls may name any path on this host; list the folders they may use")
    return out
