"""RPC metrics of every gRPC server: `rpc.server.duration` (OpenTelemetry's RPC semantic convention;
Prometheus `rpc_server_duration_seconds`) by rpc.service, rpc.method and rpc.grpc.status_code.

meshrl.common.grpc_server puts `rpc_metrics_interceptor()` on every server next to the tracing one.
With metrics off (no Prometheus port, no OTLP metrics) it returns handlers unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import grpc

from meshrl.common.errors import MeshrlError
from meshrl.common.long_streams import non_blocking
from meshrl.common.telemetry import runtime
from meshrl.common.telemetry.instruments import SECONDS_BUCKETS

_histogram: tuple[int, Any] = (-1, None)


def _duration():
    """The histogram on the current meter, or None while metrics are off (cached per setup)."""
    global _histogram
    generation = runtime.generation()
    if _histogram[0] != generation:
        cfg = runtime.current_config()
        histogram = None
        if cfg is not None and cfg.metrics:
            histogram = runtime.meter().create_histogram(
                "rpc.server.duration",
                unit="s",
                description="time to handle one gRPC call, by service, method and status code",
                explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
            )
        _histogram = (generation, histogram)
    return _histogram[1]


def _code(context: grpc.ServicerContext, exc: BaseException | None) -> int:
    code = context.code() if hasattr(context, "code") else None
    if code is None and isinstance(exc, MeshrlError):
        code = exc.code
    if code is None:
        code = grpc.StatusCode.OK if exc is None else grpc.StatusCode.UNKNOWN
    return code.value[0]


@contextmanager
def _recorded(histogram, attributes: dict[str, Any], context: grpc.ServicerContext) -> Iterator[None]:
    """Records the block's duration with the call's final status code (its own, or the error's)."""
    start, failure = time.perf_counter(), None
    try:
        yield
    except BaseException as exc:
        failure = exc
        raise
    finally:
        code = _code(context, failure)
        histogram.record(time.perf_counter() - start, {**attributes, "rpc.grpc.status_code": code})


def _wrap_unary(behavior, histogram, attributes: dict[str, Any]):
    def handler(request_or_iterator, context):
        with _recorded(histogram, attributes, context):
            return behavior(request_or_iterator, context)

    return handler


def _wrap_stream(behavior, histogram, attributes: dict[str, Any]):
    def handler(request_or_iterator, context) -> Iterator[Any]:
        with _recorded(histogram, attributes, context):
            yield from behavior(request_or_iterator, context)

    return handler


class _RpcMetricsInterceptor(grpc.ServerInterceptor):
    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        histogram = _duration()
        if handler is None or histogram is None or non_blocking(handler):  # Health/Watch holds no thread
            return handler
        service, _, method = handler_call_details.method.lstrip("/").rpartition("/")
        attrs = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=_wrap_unary(handler.unary_unary, histogram, attrs))
        if handler.stream_unary is not None:
            return handler._replace(stream_unary=_wrap_unary(handler.stream_unary, histogram, attrs))
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=_wrap_stream(handler.unary_stream, histogram, attrs))
        return handler._replace(stream_stream=_wrap_stream(handler.stream_stream, histogram, attrs))


def rpc_metrics_interceptor() -> grpc.ServerInterceptor:
    return _RpcMetricsInterceptor()
