"""Health checks and status calls served on their own threads, so that a server whose workers
are all busy with long streams (a replica generating, a trainer stepping) still answers its probes.

`start_server` puts `LightCallsInterceptor` first in the chain: for the methods in LIGHT_METHODS it marks
the final handler with gRPC's `experimental_thread_pool`, a small pool that long calls never occupy.
"""

from __future__ import annotations

from concurrent import futures

import grpc

LIGHT_METHODS = ("/grpc.health.v1.Health/Check",)
LIGHT_SUFFIXES = ("/GetStatus", "/GetStats")  # every meshrl service's status call (unary, quick)


def is_light(method: str) -> bool:
    return method in LIGHT_METHODS or method.endswith(LIGHT_SUFFIXES)


def _on_pool(behavior, pool: futures.ThreadPoolExecutor):
    def run(request_or_iterator, context):
        return behavior(request_or_iterator, context)

    run.experimental_thread_pool = pool
    return run


class LightCallsInterceptor(grpc.ServerInterceptor):
    def __init__(self, workers: int = 4) -> None:
        self.pool = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grpc-light")

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or not is_light(handler_call_details.method):
            return handler
        if handler.unary_unary:  # streams (Health/Watch included) stay on the server's own pool
            return handler._replace(unary_unary=_on_pool(handler.unary_unary, self.pool))
        return handler
