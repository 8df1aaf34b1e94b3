"""The one server interceptor that maps meshrl's typed errors to gRPC status codes.

A servicer raises `InvalidArgument`, `NotFound`, ...; this turns it into the matching
status with the error's message (capped below gRPC's metadata limit; the full text is logged). Anything else becomes INTERNAL with the exception's
type and message (and is logged with its traceback), never a bare "Exception calling
application".
"""

from __future__ import annotations

import logging

import grpc

from meshrl.common.errors import MAX_MESSAGE_BYTES, REASON_KEY, MeshrlError, cap_message
from meshrl.common.long_streams import non_blocking

log = logging.getLogger(__name__)


def _abort(context: grpc.ServicerContext, exc: BaseException, method: str):
    """Aborts with the error's status; the message is capped (`cap_message`) so the trailer stays in bounds."""
    if isinstance(exc, MeshrlError):
        if len(exc.message) > MAX_MESSAGE_BYTES // 4:
            log.warning("%s refused with a long message: %s", method, exc.message[:100_000])
        if exc.reason:
            context.set_trailing_metadata(((REASON_KEY, exc.reason),))
        context.abort(exc.code, cap_message(exc.message))
    log.exception("unhandled error in %s", method)
    context.abort(grpc.StatusCode.INTERNAL, cap_message(f"internal error in {method}: {type(exc).__name__}: {exc}"))


def _wrap_unary(fn, method):
    def handler(request_or_iterator, context):
        try:
            return fn(request_or_iterator, context)
        except grpc.RpcError:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped to a status here, nowhere else
            _abort(context, exc, method)

    return handler


def _wrap_stream(fn, method):
    def handler(request_or_iterator, context):
        try:
            yield from fn(request_or_iterator, context)
        except grpc.RpcError:
            raise
        except Exception as exc:  # noqa: BLE001
            _abort(context, exc, method)

    return handler


class ErrorMappingInterceptor(grpc.ServerInterceptor):
    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or non_blocking(handler):  # Health/Watch: a generator would hold a thread
            return handler
        method = handler_call_details.method
        if handler.unary_unary:
            return handler._replace(unary_unary=_wrap_unary(handler.unary_unary, method))
        if handler.stream_unary:
            return handler._replace(stream_unary=_wrap_unary(handler.stream_unary, method))
        if handler.unary_stream:
            return handler._replace(unary_stream=_wrap_stream(handler.unary_stream, method))
        return handler._replace(stream_stream=_wrap_stream(handler.stream_stream, method))
