"""gRPC interceptors that carry one trace across services: a SERVER span per handled call, a
CLIENT span per outgoing call, W3C `traceparent` in the metadata in between.

meshrl.common.grpc_server puts `server_interceptor()` on every server and meshrl.common.grpc_channel
wraps every channel with `client_interceptors()`. All four RPC kinds are covered. Both work with
meshrl.common.grpc_errors.ErrorMappingInterceptor in either order (inner is better: the span then
records the typed exception itself). When tracing is off they cost one attribute check per call.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from meshrl.common.errors import MeshrlError
from meshrl.common.long_streams import non_blocking
from meshrl.common.telemetry import runtime
from meshrl.common.telemetry.config import DEFAULT_UNTRACED_ROOT_SERVICES

_untraced: tuple[int, frozenset[str]] = (-1, frozenset(DEFAULT_UNTRACED_ROOT_SERVICES))


def _untraced_roots() -> frozenset[str]:
    """The config's untraced_root_services, cached per setup (this runs on every call)."""
    global _untraced
    generation = runtime.generation()
    if _untraced[0] != generation:
        cfg = runtime.current_config()
        names = cfg.untraced_root_services if cfg is not None else DEFAULT_UNTRACED_ROOT_SERVICES
        _untraced = (generation, frozenset(names))
    return _untraced[1]


def split_method(full_method: str) -> tuple[str, str]:
    """'/meshrl.rollout.v1.RolloutService/Generate' -> ('meshrl.rollout.v1.RolloutService', 'Generate')."""
    service, _, method = full_method.lstrip("/").rpartition("/")
    return service, method


def _rpc_attributes(service: str, method: str) -> dict[str, Any]:
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}


def _set_failed(span: trace.Span, code: grpc.StatusCode | None, message: str) -> None:
    if code is not None:
        span.set_attribute("rpc.grpc.status_code", code.value[0])
    label = code.name if code is not None else "ERROR"
    span.set_status(Status(StatusCode.ERROR, f"{label}: {message}" if message else label))


# ------------------------------------------------------------------------------------------ server


def _context_status(context: grpc.ServicerContext) -> tuple[grpc.StatusCode | None, str]:
    code = context.code() if hasattr(context, "code") else None
    raw = context.details() if hasattr(context, "details") else None
    details = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else (raw or "")
    return code, details


def _server_failed(span: trace.Span, context: grpc.ServicerContext, exc: BaseException) -> None:
    code, details = _context_status(context)
    cause = exc
    if code is not None and type(exc) is Exception and not exc.args and exc.__context__ is not None:
        cause = exc.__context__  # context.abort() raised a bare Exception while handling the real error
    if code is None and isinstance(cause, MeshrlError):
        code = cause.code
    span.record_exception(cause)
    _set_failed(span, code, details or str(cause))


def _server_finished(span: trace.Span, context: grpc.ServicerContext) -> None:
    code, details = _context_status(context)
    if code is None or code == grpc.StatusCode.OK:
        span.set_attribute("rpc.grpc.status_code", 0)
    else:
        _set_failed(span, code, details)


def _wrap_unary_response(behavior, name: str, attributes: dict[str, Any], parent: otel_context.Context):
    def handler(request_or_iterator, context):
        span = runtime.tracer().start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        try:
            response = behavior(request_or_iterator, context)
        except BaseException as exc:
            _server_failed(span, context, exc)
            raise
        else:
            _server_finished(span, context)
            return response
        finally:
            otel_context.detach(token)
            span.end()

    return handler


def _wrap_stream_response(behavior, name: str, attributes: dict[str, Any], parent: otel_context.Context):
    def handler(request_or_iterator, context) -> Iterator[Any]:
        span = runtime.tracer().start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)
        span_context = trace.set_span_in_context(span, parent)
        responses = None
        try:
            token = otel_context.attach(span_context)
            try:
                responses = iter(behavior(request_or_iterator, context))
            finally:
                otel_context.detach(token)
            while True:
                # The span is current only while the handler's code runs, never across our yield.
                token = otel_context.attach(span_context)
                try:
                    item = next(responses)
                except StopIteration:
                    break
                finally:
                    otel_context.detach(token)
                yield item
        except GeneratorExit:
            span.set_attribute("rpc.grpc.status_code", grpc.StatusCode.CANCELLED.value[0])
            span.set_status(Status(StatusCode.ERROR, "CANCELLED: the client stopped reading"))
            raise
        except BaseException as exc:
            _server_failed(span, context, exc)
            raise
        else:
            _server_finished(span, context)
        finally:
            close = getattr(responses, "close", None)
            if close is not None:
                close()
            span.end()

    return handler


class _TracingServerInterceptor(grpc.ServerInterceptor):
    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or not runtime.tracing_enabled() or non_blocking(handler):
            return handler
        service, method = split_method(handler_call_details.method)
        carrier = {
            key: value
            for key, value in (handler_call_details.invocation_metadata or ())
            if isinstance(value, str) and key in ("traceparent", "tracestate", "baggage")
        }
        if "traceparent" not in carrier and service in _untraced_roots():
            return handler
        parent = propagate.extract(carrier)
        name = f"{service}/{method}"
        attributes = _rpc_attributes(service, method)
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=_wrap_unary_response(handler.unary_unary, name, attributes, parent))
        if handler.stream_unary is not None:
            return handler._replace(stream_unary=_wrap_unary_response(handler.stream_unary, name, attributes, parent))
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=_wrap_stream_response(handler.unary_stream, name, attributes, parent))
        return handler._replace(stream_stream=_wrap_stream_response(handler.stream_stream, name, attributes, parent))


def server_interceptor() -> grpc.ServerInterceptor:
    """A SERVER span `<package.Service>/<Method>` around every handled call, child of the caller's
    `traceparent`; failures set status ERROR with the exception event and `rpc.grpc.status_code`."""
    return _TracingServerInterceptor()


# ------------------------------------------------------------------------------------------ client


class _CallDetails(
    collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    pass


def _client_finished(span: trace.Span, call: Any) -> None:
    try:
        code = call.code()
        if code is None or code == grpc.StatusCode.OK:
            span.set_attribute("rpc.grpc.status_code", 0)
        else:
            details = call.details() or ""
            span.add_event(
                "exception",
                {"exception.type": f"grpc.RpcError({code.name})", "exception.message": details},
            )
            _set_failed(span, code, details)
    finally:
        span.end()


class _TracingClientInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    def _intercept(self, continuation, details, request):
        if not runtime.tracing_enabled():
            return continuation(details, request)
        service, method = split_method(details.method)
        if service in _untraced_roots() and not trace.get_current_span().get_span_context().is_valid:
            return continuation(details, request)
        span = runtime.tracer().start_span(
            f"{service}/{method}", kind=SpanKind.CLIENT, attributes=_rpc_attributes(service, method)
        )
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        traced = _CallDetails(
            details.method,
            details.timeout,
            [*(details.metadata or ()), *carrier.items()],
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )
        try:
            call = continuation(traced, request)
        except BaseException as exc:
            span.record_exception(exc)
            _set_failed(span, None, str(exc))
            span.end()
            raise
        call.add_done_callback(lambda done: _client_finished(span, done))
        return call

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return self._intercept(continuation, client_call_details, request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return self._intercept(continuation, client_call_details, request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return self._intercept(continuation, client_call_details, request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return self._intercept(continuation, client_call_details, request_iterator)


def client_interceptors() -> list[grpc.UnaryUnaryClientInterceptor]:
    """Interceptors for `grpc.intercept_channel(channel, *client_interceptors())`: a CLIENT span per
    call (all four kinds), ended when the call completes, with `traceparent` injected."""
    return [_TracingClientInterceptor()]
