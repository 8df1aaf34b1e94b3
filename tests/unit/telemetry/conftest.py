"""Fixtures for the telemetry tests: a clean telemetry state per test, in-memory span capture."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from meshrl.common.telemetry import TelemetryConfig, setup_telemetry, shutdown_telemetry

_OTEL_VARS = (
    "OTEL_SDK_DISABLED",
    "OTEL_SERVICE_NAME",
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_PROMETHEUS_PORT",
    "OTEL_EXPORTER_PROMETHEUS_HOST",
    "OTEL_BSP_SCHEDULE_DELAY",
)


@pytest.fixture(autouse=True)
def clean_telemetry(monkeypatch):
    """No OTEL_* variable from the outer environment, and no telemetry left set up afterwards."""
    for name in _OTEL_VARS:
        monkeypatch.delenv(name, raising=False)
    shutdown_telemetry()
    yield
    shutdown_telemetry()


@pytest.fixture
def spans() -> InMemorySpanExporter:
    """Telemetry set up for service 'client' with every finished span captured in memory."""
    exporter = InMemorySpanExporter()
    setup_telemetry("client", TelemetryConfig(), span_exporter=exporter)
    return exporter
