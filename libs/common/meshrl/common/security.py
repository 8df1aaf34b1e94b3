"""Transport security shared by every server and client: TLS / mutual TLS credentials and
the bearer-token interceptor. Tokens come from an environment variable or a mounted file.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

import grpc
import pydantic

from meshrl.common.config import StrictModel
from meshrl.common.errors import ConfigError

AUTH_HEADER = "authorization"
# The health service stays open so load balancers and Kubernetes probes need no token.
OPEN_METHODS = ("/grpc.health.v1.Health/",)


class TLSConfig(StrictModel):
    cert_file: str = pydantic.Field(description="PEM certificate of this endpoint (server) or client cert (mTLS)")
    key_file: str = pydantic.Field(description="PEM private key matching cert_file")
    ca_file: str | None = pydantic.Field(
        None, description="PEM CA bundle: servers require client certs signed by it (mTLS); clients verify the server"
    )
    server_name_override: str | None = pydantic.Field(None, description="client side: expected server name in the cert")


class ClientTLSConfig(StrictModel):
    """The client side of TLS to one peer: the CA that signs the peer's certificate and, for mutual TLS,
    this client's certificate and key."""

    ca_file: str | None = pydantic.Field(
        None, description="PEM CA bundle that signs the peer's server certificate (unset: the system's roots)"
    )
    cert_file: str | None = pydantic.Field(None, description="PEM client certificate (when the peer requires mTLS)")
    key_file: str | None = pydantic.Field(None, description="PEM private key matching cert_file")
    server_name_override: str | None = pydantic.Field(None, description="expected server name in the peer's cert")

    @pydantic.model_validator(mode="after")
    def _pair(self) -> ClientTLSConfig:
        if (self.cert_file is None) != (self.key_file is None):
            given = "cert_file" if self.cert_file else "key_file"
            raise ValueError(f"tls.{given} is set alone: give both cert_file and key_file (mTLS) or neither")
        return self


class AuthConfig(StrictModel):
    token_env: str = pydantic.Field("MESHRL_AUTH_TOKEN", description="environment variable holding the shared token")
    token_file: str | None = pydantic.Field(None, description="file holding the token (e.g. a mounted Secret)")

    def token(self) -> str | None:
        if self.token_file:
            path = Path(self.token_file)
            if not path.is_file():
                raise ConfigError(
                    "auth.token_file", self.token_file, "the file does not exist", "mount the secret there"
                )
            return path.read_text().strip() or None
        return os.environ.get(self.token_env) or None


def _read(path: str | None, field: str) -> bytes | None:
    if path is None:
        return None
    p = Path(path)
    if not p.is_file():
        raise ConfigError(field, path, "the file does not exist", "point it at a readable PEM file")
    return p.read_bytes()


def server_credentials(tls: TLSConfig) -> grpc.ServerCredentials:
    ca = _read(tls.ca_file, "tls.ca_file")
    pair = (_read(tls.key_file, "tls.key_file"), _read(tls.cert_file, "tls.cert_file"))
    return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=ca is not None)


def channel_credentials(tls: TLSConfig | ClientTLSConfig) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca_file, "tls.ca_file"),
        private_key=_read(tls.key_file, "tls.key_file"),
        certificate_chain=_read(tls.cert_file, "tls.cert_file"),
    )


def _deny(code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    def abort(_request, context):
        context.abort(code, message)

    return grpc.unary_unary_rpc_method_handler(abort)


class TokenAuthInterceptor(grpc.ServerInterceptor):
    """Refuses calls without `authorization: Bearer <token>` (UNAUTHENTICATED), except health checks; `more`:
    further tokens admitted (the scheduler's named submitters, each one identity of `meshrl.scheduler.job_access`)."""

    def __init__(self, token: str, *more: str) -> None:
        self._expected = [f"Bearer {t}".encode() for t in (token, *more)]

    def intercept_service(self, continuation, handler_call_details):
        if handler_call_details.method.startswith(OPEN_METHODS):
            return continuation(handler_call_details)
        presented = dict(handler_call_details.invocation_metadata or ()).get(AUTH_HEADER, "")
        if not presented:
            return _deny(grpc.StatusCode.UNAUTHENTICATED, "missing authorization token: set MESHRL_AUTH_TOKEN")
        if not any([hmac.compare_digest(presented.encode(), expected) for expected in self._expected]):
            return _deny(grpc.StatusCode.UNAUTHENTICATED, "invalid authorization token")
        return continuation(handler_call_details)


class _TokenClientInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    def __init__(self, token: str) -> None:
        self._header = (AUTH_HEADER, f"Bearer {token}")

    def _details(self, details):
        metadata = list(details.metadata or ()) + [self._header]
        return details._replace(metadata=metadata) if hasattr(details, "_replace") else _Details(details, metadata)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)


class _Details(grpc.ClientCallDetails):
    def __init__(self, base, metadata):
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


def token_client_interceptor(token: str) -> _TokenClientInterceptor:
    return _TokenClientInterceptor(token)
