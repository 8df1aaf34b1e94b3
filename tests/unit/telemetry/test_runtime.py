"""setup_telemetry in-process: the file exporter round trip, off means no-op, idempotence,
Ray-style carriers, sampling, log correlation and metrics (in-memory reader and Prometheus)."""

from __future__ import annotations

import json
import logging
import urllib.request

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from meshrl.common.errors import ConfigError
from meshrl.common.telemetry import (
    TelemetryConfig,
    extract_context,
    force_flush,
    inject_context,
    install_log_correlation,
    metrics,
    prometheus_address,
    read_span_file,
    server_interceptor,
    setup_telemetry,
    shutdown_telemetry,
    span_from_carrier,
    tracer,
    tracing_enabled,
)
from meshrl.common.telemetry.attributes import NODE_ID, STEP, node_span_name, step_span_name


def test_file_exporter_round_trip(tmp_path):
    path = tmp_path / "traces" / "trainer.jsonl"
    setup_telemetry("trainer", TelemetryConfig(exporter="file", path=str(path)), instance="rank-0")
    with tracer().start_as_current_span(step_span_name(7), attributes={STEP: 7}) as root:
        with tracer().start_as_current_span(
            node_span_name("actor_train"), attributes={NODE_ID: "actor_train", "sizes": (1, 2)}
        ):
            pass
        with pytest.raises(ValueError), tracer().start_as_current_span("trainer.step"):
            raise ValueError("loss is NaN at micro-batch 3")
    shutdown_telemetry()  # flushes the batch processor
    records = {r.name: r for r in read_span_file(path)}
    assert set(records) == {"step 7", "node actor_train", "trainer.step"}
    step, node, failed = records["step 7"], records["node actor_train"], records["trainer.step"]
    assert step.trace_id == format(root.get_span_context().trace_id, "032x")
    assert step.parent_span_id is None and step.attributes == {STEP: 7}
    assert node.parent_span_id == step.span_id == failed.parent_span_id
    assert node.attributes["sizes"] == [1, 2]
    assert step.service == "trainer" and step.instance == "rank-0" and step.lane == "trainer/rank-0"
    assert step.start_ns <= node.start_ns <= node.end_ns <= step.end_ns
    assert failed.is_error and "NaN" in failed.status_message
    (event,) = failed.events
    assert event.name == "exception" and event.attributes["exception.type"] == "ValueError"
    # Each line is one JSON object, and a torn last line (a killed writer) is skipped.
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line)["trace_id"] == step.trace_id for line in lines)
    with path.open("a") as f:
        f.write('{"trace_id": "ab')
    assert len(read_span_file(path)) == 3


def test_instance_from_config_names_the_lane(tmp_path):
    path = tmp_path / "rollout.jsonl"
    setup_telemetry("rollout", TelemetryConfig(exporter="file", path=str(path), batch=False, instance="replica-1"))
    with tracer().start_as_current_span("generate"):
        pass
    shutdown_telemetry()
    (record,) = read_span_file(path)
    assert record.lane == "rollout/replica-1"


def test_file_exporter_needs_a_path():
    with pytest.raises(ConfigError) as err:
        setup_telemetry("scheduler", TelemetryConfig(exporter="file"))
    assert "telemetry.path" in str(err.value)


def test_off_means_no_op_spans_and_pass_through(tmp_path):
    setup_telemetry("rollout", TelemetryConfig())
    assert not tracing_enabled()
    with tracer().start_as_current_span("step 1") as span:
        assert not span.is_recording()
        assert inject_context() == {}
    assert server_interceptor().intercept_service(lambda details: "handler", None) == "handler"
    carrier = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    with span_from_carrier("rollout.generate", carrier) as span:
        assert not span.is_recording()
    with pytest.raises(KeyError), tracer().start_as_current_span("node x"):
        raise KeyError("exceptions pass through untouched")
    assert not list(tmp_path.iterdir())


def test_setup_is_idempotent_and_restartable(tmp_path, caplog):
    first, second = InMemorySpanExporter(), InMemorySpanExporter()
    setup_telemetry("scheduler", TelemetryConfig(), span_exporter=first)
    setup_telemetry("scheduler", TelemetryConfig(), span_exporter=first)
    with caplog.at_level(logging.WARNING):
        setup_telemetry("databuffer", TelemetryConfig(), span_exporter=second)
    assert "already set up" in caplog.text
    kept = tracer()  # modules may keep the tracer from import time
    with kept.start_as_current_span("a"):
        pass
    # The global OTel API follows meshrl's provider too (third-party instrumentation).
    with trace.get_tracer("third.party").start_as_current_span("b"):
        pass
    assert [s.name for s in first.get_finished_spans()] == ["a", "b"]
    assert first.get_finished_spans()[0].resource.attributes["service.name"] == "scheduler"
    shutdown_telemetry()
    setup_telemetry("databuffer", TelemetryConfig(), span_exporter=second)
    with kept.start_as_current_span("c"):
        pass
    assert [s.name for s in second.get_finished_spans()] == ["c"]
    assert second.get_finished_spans()[0].resource.attributes["service.name"] == "databuffer"


def test_service_name_variable_is_honoured(monkeypatch, spans):
    shutdown_telemetry()
    monkeypatch.setenv("OTEL_SERVICE_NAME", "rollout-canary")
    exporter = InMemorySpanExporter()
    setup_telemetry("rollout", TelemetryConfig(), span_exporter=exporter)
    with tracer().start_as_current_span("x"):
        pass
    attrs = exporter.get_finished_spans()[0].resource.attributes
    assert attrs["service.name"] == "rollout-canary" and attrs["meshrl.service"] == "rollout"


def test_carrier_links_a_ray_style_call(spans):
    with tracer().start_as_current_span("node rollout") as parent:
        carrier = inject_context()
    assert set(carrier) >= {"traceparent"}
    # ... later, in the actor (no ambient context):
    with span_from_carrier("rollout.generate", carrier, **{"meshrl.replica": "r1", "meshrl.tokens": 64}) as child:
        assert child.is_recording()
    with pytest.raises(RuntimeError), span_from_carrier("rollout.generate", carrier):
        raise RuntimeError("engine died")
    finished = {s.name: s for s in spans.get_finished_spans()}
    child, failed = [s for s in spans.get_finished_spans() if s.name == "rollout.generate"]
    for span in (child, failed):
        assert span.parent.span_id == parent.get_span_context().span_id
        assert span.context.trace_id == parent.get_span_context().trace_id
    assert child.attributes["meshrl.replica"] == "r1"
    assert failed.status.status_code == trace.StatusCode.ERROR
    assert finished["node rollout"].parent is None
    assert not trace.get_current_span(extract_context({})).get_span_context().is_valid
    assert not trace.get_current_span(extract_context(None)).get_span_context().is_valid


def test_sampling_off_exports_nothing_but_still_propagates(monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_always_off")
    exporter = InMemorySpanExporter()
    setup_telemetry("scheduler", TelemetryConfig(), span_exporter=exporter)
    with tracer().start_as_current_span("step 1"):
        carrier = inject_context()
    assert int(carrier["traceparent"].rsplit("-", 1)[1], 16) & 1 == 0  # the not-sampled flag travels on
    with span_from_carrier("child", carrier):
        pass
    assert exporter.get_finished_spans() == ()


def test_log_lines_carry_trace_and_span_ids(spans):
    logger = logging.getLogger("meshrl.test.telemetry.logs")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    lines: list[str] = []
    handler.emit = lambda record: lines.append(handler.format(record))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        install_log_correlation([handler])
        install_log_correlation([handler])  # twice is harmless
        logger.info("outside")
        with tracer().start_as_current_span("node reward") as span:
            logger.info("inside")
    finally:
        logger.removeHandler(handler)
    ctx = span.get_span_context()
    assert lines[0] == "INFO outside"
    assert lines[1] == f"INFO inside trace_id={ctx.trace_id:032x} span_id={ctx.span_id:016x}"


def _points(reader: InMemoryMetricReader) -> dict[str, list]:
    data = reader.get_metrics_data()
    out: dict[str, list] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out[metric.name] = list(metric.data.data_points)
    return out


def test_metric_helpers_record_with_attributes():
    reader = InMemoryMetricReader()
    setup_telemetry("scheduler", TelemetryConfig(), metric_reader=reader)
    m = metrics()
    m.record_step(2.5)
    m.record_node("rollout", 1.25, node_type="rollout")
    m.record_node("rollout", 0.75, node_type="rollout")
    m.record_tokens(1000, 2.0, phase="generate", replica="r0")
    m.set_weight_version("r0", 3)
    m.set_weight_version("r1", 2)
    m.record_weight_update(0.2, transport="disk", replica="r0")
    points = _points(reader)
    (node,) = points["meshrl.node.duration"]
    assert node.count == 2 and node.sum == pytest.approx(2.0) and node.attributes["meshrl.node_id"] == "rollout"
    assert points["meshrl.tokens"][0].value == 1000
    assert points["meshrl.tokens_per_second"][0].value == pytest.approx(500.0)
    versions = {p.attributes["meshrl.replica"]: p.value for p in points["meshrl.weights.version"]}
    assert versions == {"r0": 3, "r1": 2}
    assert not {"meshrl.queue.depth", "meshrl.buffer.bytes", "meshrl.buffer.lag"} & set(points)  # never set: gone
    assert points["meshrl.weights.update.duration"][0].attributes["meshrl.transport"] == "disk"
    assert force_flush()


def test_prometheus_endpoint_serves_the_metrics():
    setup_telemetry("rollout", TelemetryConfig(prometheus_port=0, prometheus_host="127.0.0.1"))
    host, port = prometheus_address()
    metrics().set_weight_version("r7", 11)
    metrics().record_node("reward", 0.03)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'meshrl_weights_version{meshrl_replica="r7"' in body
    line = next(x for x in body.splitlines() if x.startswith("meshrl_weights_version{"))
    assert line.endswith(" 11.0")
    assert "meshrl_node_duration_seconds_count" in body
    shutdown_telemetry()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_the_prometheus_endpoint_binds_loopback_unless_configured():
    setup_telemetry("rollout", TelemetryConfig(prometheus_port=0))
    try:
        host, _port = prometheus_address()
        assert host == "127.0.0.1", f"the default bound {host}: every interface would serve the metrics"
    finally:
        shutdown_telemetry()
