"""Transport security: token auth (missing / wrong token → UNAUTHENTICATED, health stays open),
TLS (a plaintext client fails), mutual TLS (a client certificate from another CA is refused)."""

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from meshrl.common.errors import ConfigError, Unauthenticated
from meshrl.common.grpc_channel import ChannelConfig, call, open_channel
from meshrl.common.grpc_server import ServerConfig, Service, start_server
from meshrl.common.security import AuthConfig, TLSConfig

from ._certs import CA

SERVICE = "meshrl.test.v1.Echo"


def _add(_servicer, server):
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {"Echo": handler})])


def _echo(channel, **kw):
    return call(channel.unary_unary(f"/{SERVICE}/Echo"), b"hi", timeout=5, **kw)


@pytest.fixture
def token_server(tmp_path):
    (tmp_path / "token").write_text("s3cret\n")
    cfg = ServerConfig(port=0, auth=AuthConfig(token_file=str(tmp_path / "token")))
    running = start_server(cfg, [Service(_add, None, SERVICE)])
    yield running
    running.stop(0)


def test_token_required(token_server, tmp_path, monkeypatch):
    monkeypatch.delenv("MESHRL_AUTH_TOKEN", raising=False)
    with pytest.raises(Unauthenticated, match="missing"):
        _echo(open_channel(token_server.address))
    (tmp_path / "wrong").write_text("guess")
    wrong = ChannelConfig(auth=AuthConfig(token_file=str(tmp_path / "wrong")))
    with pytest.raises(Unauthenticated, match="invalid"):
        _echo(open_channel(token_server.address, wrong))
    good = ChannelConfig(auth=AuthConfig(token_file=str(tmp_path / "token")))
    assert _echo(open_channel(token_server.address, good)) == b"hi"
    monkeypatch.setenv("MESHRL_AUTH_TOKEN", "s3cret")
    assert _echo(open_channel(token_server.address)) == b"hi"


def test_health_needs_no_token(token_server, monkeypatch):
    monkeypatch.delenv("MESHRL_AUTH_TOKEN", raising=False)
    stub = health_pb2_grpc.HealthStub(open_channel(token_server.address))
    assert stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status == health_pb2.HealthCheckResponse.SERVING


def test_require_auth_without_token_fails_at_start(monkeypatch):
    monkeypatch.delenv("MESHRL_AUTH_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="no token"):
        start_server(ServerConfig(port=0, require_auth=True), [Service(_add, None, SERVICE)])


@pytest.fixture
def pki(tmp_path):
    ca, other = CA(tmp_path, "ca"), CA(tmp_path, "other-ca")
    return ca, other


def test_plaintext_client_fails_against_tls(pki, monkeypatch):
    monkeypatch.delenv("MESHRL_AUTH_TOKEN", raising=False)
    ca, _ = pki
    cert, key = ca.issue("server")
    running = start_server(
        ServerConfig(port=0, tls=TLSConfig(cert_file=cert, key_file=key)), [Service(_add, None, SERVICE)]
    )
    try:
        plain = grpc.insecure_channel(running.address)
        with pytest.raises(grpc.RpcError) as info:
            plain.unary_unary(f"/{SERVICE}/Echo")(b"hi", timeout=3)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        tls = ChannelConfig(tls=TLSConfig(cert_file=cert, key_file=key, ca_file=ca.cert_file), retry_max_attempts=1)
        assert _echo(open_channel(f"localhost:{running.port}", tls)) == b"hi"
    finally:
        running.stop(0)


def test_mtls_refuses_a_client_from_another_ca(pki, monkeypatch):
    monkeypatch.delenv("MESHRL_AUTH_TOKEN", raising=False)
    ca, other = pki
    cert, key = ca.issue("server")
    server_tls = TLSConfig(cert_file=cert, key_file=key, ca_file=ca.cert_file)
    running = start_server(ServerConfig(port=0, tls=server_tls), [Service(_add, None, SERVICE)])
    try:
        good_cert, good_key = ca.issue("client")
        good = ChannelConfig(tls=TLSConfig(cert_file=good_cert, key_file=good_key, ca_file=ca.cert_file))
        assert _echo(open_channel(f"localhost:{running.port}", good)) == b"hi"
        bad_cert, bad_key = other.issue("intruder")
        bad = ChannelConfig(
            tls=TLSConfig(cert_file=bad_cert, key_file=bad_key, ca_file=ca.cert_file), retry_max_attempts=1
        )
        with pytest.raises(grpc.RpcError) as info:
            open_channel(f"localhost:{running.port}", bad).unary_unary(f"/{SERVICE}/Echo")(
                b"hi", timeout=3, wait_for_ready=False
            )
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        running.stop(0)
