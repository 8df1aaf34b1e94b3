"""Peer checks at start (`meshrl.common.peers.check_peer`) against a real server with mutual TLS and
a token: each misconfiguration (plaintext, wrong CA, no client certificate, a certificate from another
CA, no token, a wrong token, TLS against plaintext, nothing listening) fails with the peer's name, the
config field and the fix; the right config passes. Also: advertised addresses are never wildcards."""

import grpc
import pytest

from meshrl.common.errors import ConfigError, Unavailable
from meshrl.common.grpc_channel import ChannelConfig, peer_channel
from meshrl.common.grpc_server import ServerConfig, Service, advertised_host, start_server
from meshrl.common.peers import check_peer
from meshrl.common.security import AuthConfig, ClientTLSConfig, TLSConfig

from ._certs import CA

SERVICE = "meshrl.test.v1.Echo"
HOST = "127.0.0.2"  # a simulated host of its own


def _add(_servicer, server):
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {"Echo": handler})])


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    root = tmp_path_factory.mktemp("pki")
    ca, other = CA(root, "ca"), CA(root, "other-ca")
    cert, key = ca.issue("server", ips=(HOST,))
    (root / "token").write_text("s3cret\n")
    (root / "wrong").write_text("guess\n")
    server = ServerConfig(
        host=HOST,
        port=0,
        auth=AuthConfig(token_file=str(root / "token")),
        require_auth=True,
        tls=TLSConfig(cert_file=cert, key_file=key, ca_file=ca.cert_file),
    )
    running = start_server(server, [Service(_add, None, SERVICE)])
    client_cert, client_key = ca.issue("client")
    foreign_cert, foreign_key = other.issue("intruder")
    good = ChannelConfig(
        tls=ClientTLSConfig(ca_file=ca.cert_file, cert_file=client_cert, key_file=client_key),
        auth=AuthConfig(token_file=str(root / "token")),
        check_seconds=3,
    )
    yield {"running": running, "good": good, "root": root, "other": other, "foreign": (foreign_cert, foreign_key)}
    running.stop(0)


def _check(cfg: ChannelConfig, address: str):
    return check_peer("the data buffer", cfg, field="databuffer", address=address)


def test_the_right_channel_passes(secured):
    assert secured["running"].address.startswith(f"{HOST}:")
    assert _check(secured["good"], secured["running"].address) == secured["running"].address


@pytest.mark.parametrize(
    "change, field, words",
    [
        ({"tls": None}, "databuffer.tls", "refused a plaintext connection"),
        ({"tls": {"ca_file": "OTHER"}}, "databuffer.tls.ca_file", "not signed by this CA"),
        ({"tls": {"ca_file": "CA", "cert_file": None, "key_file": None}}, "databuffer.tls.cert_file", "mutual TLS"),
        (
            {"tls": {"ca_file": "CA", "cert_file": "FOREIGN", "key_file": "FOREIGN_KEY"}},
            "databuffer.tls.cert_file",
            "refused this client certificate",
        ),
        (
            {"auth": {"token_file": None, "token_env": "MESHRL_TEST_UNSET_TOKEN"}},
            "databuffer.auth.token_file",
            "requires a token",
        ),
        ({"auth": {"token_file": "WRONG"}}, "databuffer.auth.token_file", "refused the token"),
    ],
)
def test_each_misconfiguration_names_the_peer_and_the_fix(secured, monkeypatch, change, field, words):
    monkeypatch.delenv("MESHRL_TEST_UNSET_TOKEN", raising=False)
    good = secured["good"]
    foreign_cert, foreign_key = secured["foreign"]
    names = {
        "OTHER": secured["other"].cert_file,
        "CA": good.tls.ca_file,
        "FOREIGN": foreign_cert,
        "FOREIGN_KEY": foreign_key,
        "WRONG": str(secured["root"] / "wrong"),
    }
    data = good.model_dump()
    for section, values in change.items():
        if values is None:
            data[section] = None
        else:
            data[section] = {**(data[section] or {}), **{k: names.get(v, v) for k, v in values.items()}}
    with pytest.raises(ConfigError) as info:
        _check(ChannelConfig.model_validate(data), secured["running"].address)
    message = str(info.value)
    assert info.value.field == field, message
    assert "the data buffer" in message and words in message and "Fix:" in message


def test_tls_against_a_plaintext_server_says_so(secured):
    plain = start_server(ServerConfig(host=HOST, port=0), [Service(_add, None, SERVICE)])
    try:
        with pytest.raises(ConfigError, match="serves plaintext"):
            _check(secured["good"].model_copy(update={"auth": AuthConfig()}), plain.address)
    finally:
        plain.stop(0)


def test_nothing_listening_is_unavailable_naming_the_peer(secured):
    with pytest.raises(Unavailable, match="the data buffer does not answer at 127.0.0.2:1"):
        check_peer("the data buffer", secured["good"], field="databuffer", address="127.0.0.2:1", timeout=1)


def test_a_missing_pem_file_fails_before_any_call(secured):
    cfg = secured["good"].model_copy(update={"tls": ClientTLSConfig(ca_file="/nonexistent/ca.pem")})
    with pytest.raises(ConfigError) as info:
        _check(cfg, secured["running"].address)
    assert info.value.field == "databuffer.tls.ca_file"


def test_cert_without_key_is_refused_at_load():
    with pytest.raises(ValueError, match="give both cert_file and key_file"):
        ClientTLSConfig(cert_file="c.pem")


def test_address_shortcut_and_section_must_agree():
    assert peer_channel(ChannelConfig(), None, "databuffer") is None
    assert peer_channel(ChannelConfig(), "127.0.0.2:5", "databuffer").address == "127.0.0.2:5"
    with pytest.raises(ConfigError, match="disagrees"):
        peer_channel(ChannelConfig(address="127.0.0.2:5"), "127.0.0.3:5", "databuffer")


def test_advertised_host_is_never_a_wildcard(monkeypatch):
    assert advertised_host(ServerConfig(host="127.0.0.3")) == "127.0.0.3"
    assert advertised_host(ServerConfig(host="0.0.0.0", advertise_host="127.0.0.4")) == "127.0.0.4"
    monkeypatch.setenv("POD_IP", "127.0.0.5")
    assert advertised_host(ServerConfig(host="0.0.0.0")) == "127.0.0.5"
    monkeypatch.delenv("POD_IP")
    assert advertised_host(ServerConfig(host="0.0.0.0")) not in ("0.0.0.0", "")
    with pytest.raises(ConfigError, match="advertise_host"):
        advertised_host(ServerConfig(host="0.0.0.0", advertise_host="0.0.0.0"))
