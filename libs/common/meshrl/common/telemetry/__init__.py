"""OpenTelemetry for meshrl: one trace per training step across every service, metrics, log ids.

Services call `setup_telemetry(name, config.telemetry)` once (meshrl.common.grpc_server does) and
`shutdown_telemetry()` on exit; servers and channels get `server_interceptor()` and
`client_interceptors()`; Ray actor calls carry `inject_context()` into `span_from_carrier(...)`.
The file exporter's JSONL is what `meshrl trace RUN_DIR` (meshrl.scheduler.traceview) renders.
"""

from meshrl.common.telemetry import attributes
from meshrl.common.telemetry.config import TelemetryConfig, build_sampler, resolve_config
from meshrl.common.telemetry.grpc_interceptors import client_interceptors, server_interceptor
from meshrl.common.telemetry.instruments import MeshrlMetrics, metrics
from meshrl.common.telemetry.log_correlation import LOG_FORMAT, TraceIdFormatter, install_log_correlation
from meshrl.common.telemetry.propagation import extract_context, inject_context, span_from_carrier
from meshrl.common.telemetry.rpc_metrics import rpc_metrics_interceptor
from meshrl.common.telemetry.runtime import (
    current_config,
    force_flush,
    meter,
    prometheus_address,
    setup_telemetry,
    shutdown_telemetry,
    tracer,
    tracing_enabled,
)
from meshrl.common.telemetry.span_file import JsonlSpanExporter, SpanRecord, read_span_file, read_span_files
from meshrl.common.telemetry.spans import tag_span

__all__ = [
    "rpc_metrics_interceptor",
    "LOG_FORMAT",
    "JsonlSpanExporter",
    "MeshrlMetrics",
    "SpanRecord",
    "TelemetryConfig",
    "TraceIdFormatter",
    "attributes",
    "build_sampler",
    "client_interceptors",
    "current_config",
    "extract_context",
    "force_flush",
    "inject_context",
    "install_log_correlation",
    "meter",
    "metrics",
    "prometheus_address",
    "read_span_file",
    "read_span_files",
    "resolve_config",
    "server_interceptor",
    "setup_telemetry",
    "shutdown_telemetry",
    "tag_span",
    "span_from_carrier",
    "tracer",
    "tracing_enabled",
]
