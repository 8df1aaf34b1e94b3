"""Spans reach a real OTLP receiver on localhost: a TraceService gRPC server (and an HTTP
/v1/traces endpoint) built here from the opentelemetry-proto definitions, configured through
TelemetryConfig or the standard OTEL_* variables. The trace holds a step, a node, a gRPC call
(client and server side, through meshrl's interceptors) and a failed span with its exception."""

from __future__ import annotations

import gzip
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

from meshrl.common.telemetry import (
    TelemetryConfig,
    client_interceptors,
    server_interceptor,
    setup_telemetry,
    shutdown_telemetry,
    tracer,
)
from meshrl.common.telemetry.attributes import NODE_ID, STEP

OTEL_VARS = (
    "OTEL_SDK_DISABLED",
    "OTEL_SERVICE_NAME",
    "OTEL_TRACES_EXPORTER",
    "OTEL_TRACES_SAMPLER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_METRICS_EXPORTER",
)


class Collected:
    """What a receiver got: (service.name, span) pairs."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[tuple[str, trace_pb2.Span]] = []

    def add(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        with self.lock:
            for resource_spans in request.resource_spans:
                attrs = {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend((attrs.get("service.name", ""), span) for span in scope_spans.spans)


class TraceReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, collected: Collected) -> None:
        self.collected = collected

    def Export(self, request, context):
        self.collected.add(request)
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def grpc_receiver():
    collected = Collected()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceReceiver(collected), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"http://127.0.0.1:{port}", collected
    server.stop(grace=None)


@pytest.fixture
def http_receiver():
    collected = Collected()
    paths: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            paths.append(self.path)
            collected.add(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
            reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", collected, paths
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    for name in OTEL_VARS:
        monkeypatch.delenv(name, raising=False)
    shutdown_telemetry()
    yield
    shutdown_telemetry()


def _run_one_traced_step() -> int:
    """A step with a node, a gRPC health call through both interceptors, and a failing span."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), interceptors=[server_interceptor()])
    health_servicer = health.HealthServicer()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.intercept_channel(grpc.insecure_channel(f"127.0.0.1:{port}"), *client_interceptors())
    try:
        with tracer().start_as_current_span("step 3", attributes={STEP: 3}) as root:
            with tracer().start_as_current_span("node reward", attributes={NODE_ID: "reward"}):
                health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            with pytest.raises(KeyError), tracer().start_as_current_span("node advantage"):
                raise KeyError("rewards missing for group 4")
    finally:
        channel.close()
        server.stop(grace=None)
    shutdown_telemetry()  # flushes the batch processor to the receiver
    return root.get_span_context().trace_id


def _check(collected: Collected, trace_id: int, service: str) -> None:
    check = "grpc.health.v1.Health/Check"
    assert sorted(span.name for _, span in collected.spans) == sorted(
        ["step 3", "node reward", "node advantage", check, check]  # the call's client and server spans
    )
    by_name = {span.name: (svc, span) for svc, span in collected.spans}
    assert {svc for svc, _ in collected.spans} == {service}
    assert all(int.from_bytes(span.trace_id, "big") == trace_id for _, span in collected.spans)
    step = by_name["step 3"][1]
    reward = by_name["node reward"][1]
    assert step.parent_span_id == b""
    assert step.attributes[0].key == STEP and step.attributes[0].value.int_value == 3
    assert reward.parent_span_id == step.span_id
    checks = {span.kind: span for _, span in collected.spans if span.name == check}
    client, server = checks[trace_pb2.Span.SPAN_KIND_CLIENT], checks[trace_pb2.Span.SPAN_KIND_SERVER]
    assert client.parent_span_id == reward.span_id
    assert server.parent_span_id == client.span_id
    failed = by_name["node advantage"][1]
    assert failed.status.code == trace_pb2.Status.STATUS_CODE_ERROR
    (event,) = failed.events
    assert event.name == "exception"
    assert {kv.key: kv.value.string_value for kv in event.attributes}["exception.type"] == "KeyError"


def test_otlp_grpc_from_config(grpc_receiver):
    endpoint, collected = grpc_receiver
    setup_telemetry("scheduler", TelemetryConfig(exporter="otlp", endpoint=endpoint))
    _check(collected, _run_one_traced_step(), "scheduler")


def test_otlp_grpc_from_environment(grpc_receiver, monkeypatch):
    endpoint, collected = grpc_receiver
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "trainer-under-test")
    setup_telemetry("trainer", TelemetryConfig(exporter="file", path="/nonexistent/never-written.jsonl"))
    _check(collected, _run_one_traced_step(), "trainer-under-test")


def test_otlp_http_from_environment(http_receiver, monkeypatch):
    endpoint, collected, paths = http_receiver
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    setup_telemetry("databuffer", TelemetryConfig())
    _check(collected, _run_one_traced_step(), "databuffer")
    assert set(paths) == {"/v1/traces"}


def test_otlp_http_from_config(http_receiver):
    endpoint, collected, paths = http_receiver
    setup_telemetry("rollout", TelemetryConfig(exporter="otlp-http", endpoint=endpoint))
    _check(collected, _run_one_traced_step(), "rollout")
    assert set(paths) == {"/v1/traces"}
