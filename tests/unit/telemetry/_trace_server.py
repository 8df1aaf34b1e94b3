"""A gRPC server process for the propagation tests: the health service plus an echo service with
all four RPC kinds and failing methods, behind the tracing and typed-error interceptors, exporting
its spans to a JSONL file. Run by tests/unit/telemetry/test_grpc_propagation.py; stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import threading
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from meshrl.common.errors import InvalidArgument
from meshrl.common.grpc_errors import ErrorMappingInterceptor
from meshrl.common.telemetry import TelemetryConfig, server_interceptor, setup_telemetry, shutdown_telemetry, tracer

SERVICE = "meshrl.test.Echo"


def _work(label: str) -> None:
    with tracer().start_as_current_span("echo.work", attributes={"echo.label": label}):
        pass


def unary(request: bytes, context) -> bytes:
    _work("unary")
    return request.upper()


def server_stream(request: bytes, context):
    for i in range(3):
        _work(f"server_stream.{i}")
        yield request + str(i).encode()


def client_stream(requests, context) -> bytes:
    _work("client_stream")
    return b"|".join(requests)


def bidi_stream(requests, context):
    for item in requests:
        _work("bidi_stream")
        yield item[::-1]


def fail(request: bytes, context) -> bytes:
    raise InvalidArgument(f"echo payload {request!r} is not allowed; send anything else")


def crash(request: bytes, context) -> bytes:
    raise ValueError("echo crashed on purpose")


def fail_stream(request: bytes, context):
    yield b"first"
    raise InvalidArgument("the second item is refused")


def build_server(order: str) -> grpc.Server:
    tracing, errors = server_interceptor(), ErrorMappingInterceptor()
    interceptors = [errors, tracing] if order == "tracing-inner" else [tracing, errors]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), interceptors=interceptors)
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream),
        "ClientStream": grpc.stream_unary_rpc_method_handler(client_stream),
        "BidiStream": grpc.stream_stream_rpc_method_handler(bidi_stream),
        "Fail": grpc.unary_unary_rpc_method_handler(fail),
        "Crash": grpc.unary_unary_rpc_method_handler(crash),
        "FailStream": grpc.unary_stream_rpc_method_handler(fail_stream),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    health_servicer = health.HealthServicer()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trace-file", required=True)
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--order", choices=("tracing-inner", "tracing-outer"), default="tracing-inner")
    args = parser.parse_args()
    setup_telemetry("echo", TelemetryConfig(exporter="file", path=args.trace_file, batch=False))
    server = build_server(args.order)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    tmp = Path(args.port_file + ".tmp")
    tmp.write_text(str(port))
    tmp.rename(args.port_file)
    stop.wait()
    server.stop(grace=2).wait()
    shutdown_telemetry()


if __name__ == "__main__":
    main()
