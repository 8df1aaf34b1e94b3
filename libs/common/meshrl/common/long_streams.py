"""Long-lived server streams cannot hold a server's thread pool: the health service's Watch stays non-blocking
through meshrl's interceptors (an idle watcher holds no thread), and the streams that hold a thread for as long
as the client keeps them open (WatchJob, reflection) are bounded by `server.max_long_streams`, refused beyond
it with RESOURCE_EXHAUSTED.

`meshrl.common.grpc_server.start_server` installs `LongStreamsInterceptor`; the error-mapping, tracing and
metrics interceptors leave a handler alone when `non_blocking` says it answers through a callback.
"""

from __future__ import annotations

import threading
from typing import Any

import grpc

# Streams that live as long as their client wants, each on a server thread.
LONG_METHODS = (
    "/meshrl.scheduler.v1.Scheduler/WatchJob",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
)


def non_blocking(handler: Any) -> bool:
    """Whether gRPC calls this handler's behaviour with a response callback and frees the thread (Health/Watch):
    wrapping it in a generator would make it hold a thread for the whole stream."""
    behavior = handler.unary_stream or handler.stream_stream
    return bool(getattr(behavior, "experimental_non_blocking", False))


class LongStreamsInterceptor(grpc.ServerInterceptor):
    """At most `limit` LONG_METHODS streams at once; one more is refused at once, naming the setting."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._slots = threading.BoundedSemaphore(limit)

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method not in LONG_METHODS or non_blocking(handler):
            return handler
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=self._bounded(handler.unary_stream))
        if handler.stream_stream is not None:
            return handler._replace(stream_stream=self._bounded(handler.stream_stream))
        return handler

    def _bounded(self, behavior):
        def handler(request_or_iterator, context):
            if not self._slots.acquire(blocking=False):
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"this server already holds {self.limit} long-lived streams (watches, reflection); close one "
                    "or retry later. Operators: raise server.max_long_streams (and server.max_workers with it)",
                )
            try:
                yield from behavior(request_or_iterator, context)
            finally:
                self._slots.release()

        return handler
