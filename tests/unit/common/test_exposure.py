"""A service started open to its network says so once, naming the setting that closes each opening: no token,
a wildcard bind (without TLS), Prometheus on every interface, `paths.roots: []`. A secured config says nothing."""

from __future__ import annotations

from types import SimpleNamespace

from meshrl.common.exposure import exposure_warnings
from meshrl.common.grpc_server import ServerConfig
from meshrl.common.path_roots import PathRoots
from meshrl.common.telemetry import TelemetryConfig


def _cfg(server: ServerConfig, telemetry=None, paths=None) -> SimpleNamespace:
    return SimpleNamespace(
        server=server, telemetry=telemetry or TelemetryConfig(), paths=paths or PathRoots(roots=["."])
    )


def test_each_opening_is_named_with_its_setting(tmp_path, monkeypatch):
    monkeypatch.delenv("MESHRL_AUTH_TOKEN", raising=False)
    open_cfg = _cfg(
        ServerConfig(host="0.0.0.0", port=50051),
        TelemetryConfig(prometheus_port=9464, prometheus_host="0.0.0.0"),
        PathRoots(roots=[]),
    )
    text = "\n".join(exposure_warnings(open_cfg, "10.0.0.5:50051"))
    for words in (
        "without a token",
        "10.0.0.5:50051",
        "MESHRL_AUTH_TOKEN",
        "server.auth.token_file",
        "server.require_auth",
        "server.host = '0.0.0.0'",
        "without TLS",
        "server.tls",
        "telemetry.prometheus_host",
        "paths.roots is empty",
    ):
        assert words in text, (words, text)


def test_a_secured_config_says_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("MESHRL_AUTH_TOKEN", raising=False)
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    secured = ServerConfig(host="127.0.0.2", auth={"token_file": str(token)}, require_auth=True)
    assert exposure_warnings(_cfg(secured, TelemetryConfig(prometheus_port=9464))) == []
    monkeypatch.setenv("MESHRL_AUTH_TOKEN", "from-the-environment")
    assert exposure_warnings(_cfg(ServerConfig(host="127.0.0.2"))) == []
    monkeypatch.delenv("MESHRL_AUTH_TOKEN")
    assert exposure_warnings(_cfg(ServerConfig(host="127.0.0.2")), more_tokens=True) == []  # submitters' tokens
