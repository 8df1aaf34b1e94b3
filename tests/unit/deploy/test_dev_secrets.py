"""deploy/gen-dev-secrets.sh makes secrets that work: the certificate chains to its CA, carries the
names peers dial (Service names, "meshrl" for replicas dialled by IP) and serves mutual TLS through
meshrl's own credentials helpers; a client with another CA's certificate, or none, is refused."""

from __future__ import annotations

import shutil
import subprocess
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from _deploy_lib import DEPLOY, SECRET_FILES
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from meshrl.common.security import TLSConfig, channel_credentials, server_credentials

SCRIPT = DEPLOY / "gen-dev-secrets.sh"
pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed here")


def _generate(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *extra, str(out)], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def secrets(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("secrets")
    result = _generate(out)
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("other")
    assert _generate(out).returncode == 0
    return out


def _tls(folder: Path, server_name: str | None = None) -> TLSConfig:
    return TLSConfig(
        cert_file=str(folder / "tls.crt"),
        key_file=str(folder / "tls.key"),
        ca_file=str(folder / "ca.crt"),
        server_name_override=server_name,
    )


@pytest.fixture(scope="module")
def mtls_server(secrets):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_secure_port("127.0.0.1:0", server_credentials(_tls(secrets)))
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(grace=None)


def _check(channel: grpc.Channel) -> int:
    with channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status


def test_writes_every_file_the_deployments_read(secrets):
    assert set(SECRET_FILES) <= {p.name for p in secrets.iterdir()}
    assert len((secrets / "auth-token").read_text().strip()) == 64
    password = (secrets / "redis-auth.conf").read_text().split()[1]
    assert f":{password}@meshrl-redis:6379/" in (secrets / "redis.env").read_text()
    assert f":{password}@meshrl-redis:6379/" in (secrets / "registry.env").read_text()
    assert (secrets / "ca.key").stat().st_mode & 0o077 == 0, "the CA key is for its owner only"


def test_refuses_to_overwrite_without_force(secrets, tmp_path):
    shutil.copytree(secrets, tmp_path / "s")
    token = (tmp_path / "s" / "auth-token").read_text()
    refused = _generate(tmp_path / "s")
    assert refused.returncode == 1 and "--force" in refused.stderr
    assert (tmp_path / "s" / "auth-token").read_text() == token
    assert _generate(tmp_path / "s", "--force").returncode == 0
    assert (tmp_path / "s" / "auth-token").read_text() != token


def test_certificate_chains_to_the_ca_and_names_the_services(secrets):
    verify = subprocess.run(
        ["openssl", "verify", "-CAfile", str(secrets / "ca.crt"), str(secrets / "tls.crt")],
        capture_output=True,
        text=True,
    )
    assert verify.returncode == 0, verify.stderr
    text = subprocess.run(
        ["openssl", "x509", "-in", str(secrets / "tls.crt"), "-noout", "-text"], capture_output=True, text=True
    ).stdout
    for name in (
        "DNS:meshrl,",
        "DNS:meshrl-databuffer,",
        "DNS:meshrl-rollout-headless.meshrl.svc,",
        "IP Address:127.0.0.1",
    ):
        assert name in text
    assert "TLS Web Server Authentication, TLS Web Client Authentication" in text


@pytest.mark.parametrize("server_name", ["meshrl", "meshrl-databuffer", None])
def test_mutual_tls_with_the_generated_certificate(secrets, mtls_server, server_name):
    channel = grpc.secure_channel(
        mtls_server,
        channel_credentials(_tls(secrets)),
        options=[("grpc.ssl_target_name_override", server_name)] if server_name else [],
    )
    assert _check(channel) == health_pb2.HealthCheckResponse.SERVING


def test_a_client_certificate_from_another_ca_is_refused(other_ca, secrets, mtls_server):
    foreign = TLSConfig(
        cert_file=str(other_ca / "tls.crt"), key_file=str(other_ca / "tls.key"), ca_file=str(secrets / "ca.crt")
    )
    channel = grpc.secure_channel(
        mtls_server, channel_credentials(foreign), options=[("grpc.ssl_target_name_override", "meshrl")]
    )
    with pytest.raises(grpc.RpcError) as info:
        _check(channel)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_plaintext_client_is_refused(mtls_server):
    with pytest.raises(grpc.RpcError) as info:
        _check(grpc.insecure_channel(mtls_server))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
