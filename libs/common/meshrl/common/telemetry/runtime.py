"""The process-wide telemetry state: tracer and meter providers, exporters, the Prometheus endpoint.

Every service's `__main__` (through meshrl.common.grpc_server) calls `setup_telemetry` once and
`shutdown_telemetry` on exit; everything else asks `tracer()` / `meter()`. The tracer handed out
always delegates to the current provider, so a module may keep it from import time. With the
exporter "none" no SDK tracer exists: a span is a shared do-nothing context manager (~1 µs).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)

from meshrl.common.errors import ConfigError
from meshrl.common.telemetry.config import TelemetryConfig, build_sampler, resolve_config
from meshrl.common.telemetry.span_file import JsonlSpanExporter

log = logging.getLogger(__name__)

SCOPE = "meshrl"


def _http_traces_url(endpoint: str) -> str:
    scheme, sep, rest = endpoint.partition("://")
    has_path = sep and "/" in rest.strip("/")
    return endpoint if has_path else endpoint.rstrip("/") + "/v1/traces"


def _span_exporter(cfg: TelemetryConfig) -> SpanExporter:
    if cfg.exporter == "file":
        if not cfg.path:
            raise ConfigError(
                "telemetry.path",
                None,
                "the file exporter needs a file",
                "set telemetry.path to RUN_DIR/traces/<service>.jsonl",
            )
        return JsonlSpanExporter(cfg.path)
    if cfg.exporter == "console":
        return ConsoleSpanExporter()
    if cfg.exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=cfg.endpoint, insecure=cfg.insecure, headers=cfg.headers or None)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter

    endpoint = _http_traces_url(cfg.endpoint) if cfg.endpoint else None
    return HttpSpanExporter(endpoint=endpoint, headers=cfg.headers or None)


def _metric_exporter(cfg: TelemetryConfig) -> Any:
    if cfg.metrics_exporter == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

        return ConsoleMetricExporter()
    if cfg.metrics_exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter(endpoint=cfg.endpoint, insecure=cfg.insecure, headers=cfg.headers or None)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter

    endpoint = None
    if cfg.endpoint:
        endpoint = _http_traces_url(cfg.endpoint).removesuffix("/v1/traces") + "/v1/metrics"
    return HttpMetricExporter(endpoint=endpoint, headers=cfg.headers or None)


@dataclass
class _State:
    generation: int = 0
    key: tuple[Any, ...] | None = None
    tracer_provider: TracerProvider | None = None
    meter_provider: MeterProvider | None = None
    prometheus_server: Any = None
    prometheus_address: tuple[str, int] | None = None
    resource: Resource | None = None
    config: TelemetryConfig | None = None


_STATE = _State()
_LOCK = threading.RLock()
_NOOP_TRACER = trace.NoOpTracer()
_globals_installed = False


class _NoSpan:
    """What `start_as_current_span` returns while tracing is off: enters as the invalid span,
    records nothing, touches no context (about 1 µs instead of the API no-op's ~10)."""

    __slots__ = ()

    def __enter__(self) -> trace.Span:
        return trace.INVALID_SPAN

    def __exit__(self, *exc_info: object) -> bool:
        return False


_NO_SPAN = _NoSpan()


class _DelegatingTracer(trace.Tracer):
    """A tracer that always starts spans on the provider of the current `setup_telemetry`."""

    def __init__(self, name: str, version: str | None = None, schema_url: str | None = None) -> None:
        self._args = (name, version, schema_url)
        self._generation = -1
        self._delegate: trace.Tracer = _NOOP_TRACER

    def _current(self) -> trace.Tracer:
        state = _STATE
        if self._generation != state.generation:
            provider = state.tracer_provider
            self._delegate = provider.get_tracer(*self._args) if provider is not None else _NOOP_TRACER
            self._generation = state.generation
        return self._delegate

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        return self._current().start_span(*args, **kwargs)

    def start_as_current_span(self, *args: Any, **kwargs: Any):  # returns the delegate's context manager
        delegate = self._current()
        if delegate is _NOOP_TRACER:
            return _NO_SPAN
        return delegate.start_as_current_span(*args, **kwargs)


class _DelegatingTracerProvider(trace.TracerProvider):
    """Installed as the global provider once, so third-party code follows a later re-setup too."""

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Any = None,
    ) -> trace.Tracer:
        return _DelegatingTracer(instrumenting_module_name, instrumenting_library_version, schema_url)


_TRACER = _DelegatingTracer(SCOPE)


def tracer() -> trace.Tracer:
    """meshrl's tracer; safe to keep in a module global (it follows `setup_telemetry`)."""
    return _TRACER


def tracing_enabled() -> bool:
    """True when spans are recorded and exported (lets hot paths skip building attributes)."""
    return _STATE.tracer_provider is not None


def meter() -> metrics.Meter:
    """meshrl's meter on the current provider (a no-op meter when metrics are off)."""
    provider = _STATE.meter_provider
    return provider.get_meter(SCOPE) if provider is not None else metrics.NoOpMeter(SCOPE)


def generation() -> int:
    """Changes on every setup and shutdown; lets callers cache what they derive from the state."""
    return _STATE.generation


def current_config() -> TelemetryConfig | None:
    """The resolved config of the active setup (OTEL_* applied), or None before setup."""
    return _STATE.config


def prometheus_address() -> tuple[str, int] | None:
    """(host, port) the Prometheus endpoint actually listens on (useful with prometheus_port=0)."""
    return _STATE.prometheus_address


def _resource(service_name: str, cfg: TelemetryConfig, instance: str | None) -> Resource:
    attributes: dict[str, Any] = {
        "service.name": os.environ.get("OTEL_SERVICE_NAME") or service_name,
        "meshrl.service": service_name,
        "process.pid": os.getpid(),
    }
    if instance is not None:
        attributes["service.instance.id"] = instance
        attributes["meshrl.instance"] = instance
    attributes.update(cfg.resource_attributes)
    return Resource.create(attributes)


def _start_prometheus(cfg: TelemetryConfig, readers: list[MetricReader]) -> tuple[Any, tuple[str, int]]:
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=True)
    readers.append(PrometheusMetricReader(registry=registry))
    try:
        server, _thread = start_http_server(cfg.prometheus_port or 0, addr=cfg.prometheus_host, registry=registry)
    except OSError as exc:
        raise ConfigError(
            "telemetry.prometheus_port", cfg.prometheus_port, f"cannot listen there ({exc})", "pick a free port or 0"
        ) from exc
    host, port = server.server_address[:2]
    return server, (str(host), int(port))


def setup_telemetry(
    service_name: str,
    config: TelemetryConfig,
    *,
    instance: str | None = None,
    span_exporter: SpanExporter | None = None,
    metric_reader: MetricReader | None = None,
) -> None:
    """Sets up tracing and metrics for this process, once.

    `instance` (default: `config.instance`) distinguishes processes of one service (a rollout
    replica id): it becomes `service.instance.id` and the viewer's lane `service/instance`.
    `span_exporter` / `metric_reader` add a synchronous exporter or a reader (tests use the
    in-memory ones). A second call with the same arguments does nothing; with different ones it
    warns and keeps the first, until `shutdown_telemetry`. (Kept whole: one ordered set-up of the tracer and
    meter providers, whose parts only make sense together.)
    """
    global _globals_installed
    key = (service_name, config.model_dump_json(), instance, id(span_exporter), id(metric_reader))
    with _LOCK:
        if _STATE.key is not None:
            if _STATE.key != key:
                log.warning(
                    "setup_telemetry(%r) ignored: telemetry is already set up for %r", service_name, _STATE.key[0]
                )
            return
        cfg = resolve_config(config)
        resource = _resource(service_name, cfg, instance if instance is not None else cfg.instance)
        tracer_provider = None
        if cfg.tracing or span_exporter is not None:
            tracer_provider = TracerProvider(resource=resource, sampler=build_sampler(cfg))
            if cfg.tracing:
                exporter = _span_exporter(cfg)
                processor = BatchSpanProcessor(exporter) if cfg.batch else SimpleSpanProcessor(exporter)
                tracer_provider.add_span_processor(processor)
            if span_exporter is not None:
                tracer_provider.add_span_processor(SimpleSpanProcessor(span_exporter))
        readers: list[MetricReader] = []
        server = address = None
        if cfg.prometheus_port is not None:
            server, address = _start_prometheus(cfg, readers)
        if cfg.metrics_exporter != "none":
            interval = int(cfg.metrics_interval_s * 1000)
            readers.append(PeriodicExportingMetricReader(_metric_exporter(cfg), export_interval_millis=interval))
        if metric_reader is not None:
            readers.append(metric_reader)
        meter_provider = MeterProvider(resource=resource, metric_readers=readers) if readers else None
        if not _globals_installed:
            trace.set_tracer_provider(_DelegatingTracerProvider())
            _globals_installed = True
        if meter_provider is not None and not isinstance(metrics.get_meter_provider(), MeterProvider):
            metrics.set_meter_provider(meter_provider)
        _STATE.key = key
        _STATE.config = cfg
        _STATE.resource = resource
        _STATE.tracer_provider = tracer_provider
        _STATE.meter_provider = meter_provider
        _STATE.prometheus_server = server
        _STATE.prometheus_address = address
        _STATE.generation += 1
        log.debug(
            "telemetry for %s: traces=%s metrics=%s prometheus=%s", service_name, cfg.exporter, bool(readers), address
        )


def force_flush(timeout_millis: int = 10_000) -> bool:
    """Exports every finished span and metric now (e.g. before a test reads the trace file)."""
    ok = True
    if _STATE.tracer_provider is not None:
        ok = _STATE.tracer_provider.force_flush(timeout_millis) and ok
    if _STATE.meter_provider is not None:
        ok = _STATE.meter_provider.force_flush(timeout_millis) and ok
    return ok


def shutdown_telemetry() -> None:
    """Flushes and closes the exporters and the Prometheus endpoint; a later setup starts afresh."""
    with _LOCK:
        if _STATE.tracer_provider is not None:
            _STATE.tracer_provider.shutdown()
        if _STATE.meter_provider is not None:
            _STATE.meter_provider.shutdown()
        if _STATE.prometheus_server is not None:
            _STATE.prometheus_server.shutdown()
            _STATE.prometheus_server.server_close()
        _STATE.key = None
        _STATE.config = None
        _STATE.resource = None
        _STATE.tracer_provider = None
        _STATE.meter_provider = None
        _STATE.prometheus_server = None
        _STATE.prometheus_address = None
        _STATE.generation += 1
