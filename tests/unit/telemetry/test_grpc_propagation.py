"""A trace crosses a process boundary over gRPC: client spans here, server spans in a real server
process (tests/unit/telemetry/_trace_server.py, file exporter read back), for all four RPC kinds,
typed errors and crashes, with the tracing interceptor inside or outside the typed-error one."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.trace import SpanKind, StatusCode

from meshrl.common.errors import InvalidArgument, from_rpc_error
from meshrl.common.telemetry import SpanRecord, client_interceptors, read_span_file, tracer

SERVER_SCRIPT = Path(__file__).with_name("_trace_server.py")
SERVICE = "meshrl.test.Echo"


class EchoServer:
    def __init__(self, tmp: Path, order: str) -> None:
        self.trace_file = tmp / "traces" / "echo.jsonl"
        port_file = tmp / "port"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(SERVER_SCRIPT),
                "--trace-file",
                str(self.trace_file),
                "--port-file",
                str(port_file),
                "--order",
                order,
            ]
        )
        deadline = time.monotonic() + 60
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError(f"echo server did not start (exit code {self.proc.poll()})")
            time.sleep(0.05)
        self.address = f"127.0.0.1:{port_file.read_text()}"
        self.channel = grpc.intercept_channel(grpc.insecure_channel(self.address), *client_interceptors())

    def stop(self) -> list[SpanRecord]:
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return read_span_file(self.trace_file) if self.trace_file.exists() else []


@pytest.fixture(params=["tracing-inner", "tracing-outer"])
def echo(request, tmp_path):
    server = EchoServer(tmp_path, request.param)
    yield server
    server.stop()


def _method(channel, kind: str, name: str):
    factory = {
        "uu": channel.unary_unary,
        "us": channel.unary_stream,
        "su": channel.stream_unary,
        "ss": channel.stream_stream,
    }
    return factory[kind](f"/{SERVICE}/{name}")


def _by_name(records, name):
    return [r for r in records if r.name == name]


def test_all_four_kinds_continue_the_callers_trace(echo, spans):
    ch = echo.channel
    with tracer().start_as_current_span("step 1", attributes={"meshrl.step": 1}) as root:
        assert _method(ch, "uu", "Unary")(b"hi", timeout=10) == b"HI"
        assert list(_method(ch, "us", "ServerStream")(b"s", timeout=10)) == [b"s0", b"s1", b"s2"]
        assert _method(ch, "su", "ClientStream")(iter([b"a", b"b", b"c"]), timeout=10) == b"a|b|c"
        assert list(_method(ch, "ss", "BidiStream")(iter([b"ab", b"cd"]), timeout=10)) == [b"ba", b"dc"]
        future = _method(ch, "uu", "Unary").future(b"fut", timeout=10)
        assert future.result() == b"FUT"
        health = health_pb2_grpc.HealthStub(ch)
        assert (
            health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.SERVING
        )
    # A probe outside any trace makes no root span on either side.
    health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
    server_records = echo.stop()

    trace_id = format(root.get_span_context().trace_id, "032x")
    client = {s.name: s for s in spans.get_finished_spans() if s.kind == SpanKind.CLIENT}
    for method in ("Unary", "ServerStream", "ClientStream", "BidiStream"):
        name = f"{SERVICE}/{method}"
        (server_span,) = [
            r
            for r in server_records
            if r.name == name and r.parent_span_id == format(client[name].context.span_id, "016x")
        ]
        assert server_span.trace_id == trace_id
        assert server_span.kind == "SERVER"
        assert server_span.service == "echo"
        assert server_span.attributes["rpc.system"] == "grpc"
        assert server_span.attributes["rpc.service"] == SERVICE
        assert server_span.attributes["rpc.method"] == method
        assert server_span.attributes["rpc.grpc.status_code"] == 0
        assert server_span.status != "ERROR"
        assert format(client[name].parent.span_id, "016x") == format(root.get_span_context().span_id, "016x")
        # Work done inside the handler nests under the server span.
        work = [r for r in _by_name(server_records, "echo.work") if r.parent_span_id == server_span.span_id]
        assert len(work) == {"ServerStream": 3, "BidiStream": 2}.get(method, 1)
    unary_servers = [r for r in _by_name(server_records, f"{SERVICE}/Unary") if r.trace_id == trace_id]
    assert len(unary_servers) == 2  # blocking call and .future()
    health_servers = _by_name(server_records, "grpc.health.v1.Health/Check")
    assert [r.trace_id for r in health_servers] == [trace_id]
    assert len([s for s in spans.get_finished_spans() if s.name == "grpc.health.v1.Health/Check"]) == 1
    assert all(r.trace_id == trace_id for r in server_records)


def _exception_events(record: SpanRecord):
    return [e for e in record.events if e.name == "exception"]


def test_typed_error_and_crash_give_error_spans(echo, spans):
    ch = echo.channel
    with tracer().start_as_current_span("step 2"):
        with pytest.raises(grpc.RpcError) as failed:
            _method(ch, "uu", "Fail")(b"bad", timeout=10)
        with pytest.raises(grpc.RpcError) as crashed:
            _method(ch, "uu", "Crash")(b"x", timeout=10)
        received = []
        with pytest.raises(grpc.RpcError) as stream_failed:
            for item in _method(ch, "us", "FailStream")(b"x", timeout=10):
                received.append(item)
    # The typed-error interceptor still maps the errors.
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert isinstance(from_rpc_error(failed.value), InvalidArgument)
    assert "is not allowed" in failed.value.details()
    assert crashed.value.code() == grpc.StatusCode.INTERNAL
    assert stream_failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert received == [b"first"]
    records = echo.stop()

    (fail,) = _by_name(records, f"{SERVICE}/Fail")
    assert fail.status == "ERROR"
    assert "INVALID_ARGUMENT" in fail.status_message and "is not allowed" in fail.status_message
    assert fail.attributes["rpc.grpc.status_code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    (event,) = _exception_events(fail)
    assert event.attributes["exception.type"].endswith("InvalidArgument")
    assert "is not allowed" in event.attributes["exception.message"]

    (crash,) = _by_name(records, f"{SERVICE}/Crash")
    assert crash.status == "ERROR"
    (event,) = _exception_events(crash)
    assert event.attributes["exception.type"] == "ValueError"
    assert "crashed on purpose" in event.attributes["exception.message"]

    (fail_stream,) = _by_name(records, f"{SERVICE}/FailStream")
    assert fail_stream.status == "ERROR"
    assert _exception_events(fail_stream)[0].attributes["exception.type"].endswith("InvalidArgument")

    client = {s.name: s for s in spans.get_finished_spans() if s.kind == SpanKind.CLIENT}
    for method, code in (("Fail", "INVALID_ARGUMENT"), ("Crash", "INTERNAL"), ("FailStream", "INVALID_ARGUMENT")):
        span = client[f"{SERVICE}/{method}"]
        assert span.status.status_code == StatusCode.ERROR
        assert span.status.description.startswith(code)
        assert any(e.name == "exception" for e in span.events)
        assert span.attributes["rpc.grpc.status_code"] == getattr(grpc.StatusCode, code).value[0]
