"""meshrl's metric instruments and the helpers services call to record them.

The scheduler records step and node times, rollout tokens/s, weight versions and update durations,
all through `metrics()` (the data buffer's bytes are its own `buffer/bytes` step metric). They
reach Prometheus (`telemetry.prometheus_port`) and/or OTLP per TelemetryConfig; with metrics off
the instruments are the API's no-ops.
"""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry import metrics as otel_metrics

from meshrl.common.telemetry import runtime
from meshrl.common.telemetry.attributes import NODE_ID, NODE_TYPE, REPLICA, TRANSPORT

# Histogram buckets in seconds: from a 5 ms RPC to a 10 min step.
SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class MeshrlMetrics:
    """The instruments of one meter. Prometheus names: dots become underscores, units are suffixed
    (meshrl.node.duration in s -> meshrl_node_duration_seconds)."""

    def __init__(self, meter: otel_metrics.Meter) -> None:
        self.step_duration = meter.create_histogram(
            "meshrl.step.duration",
            unit="s",
            description="wall time of one training step",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
        )
        self.node_duration = meter.create_histogram(
            "meshrl.node.duration",
            unit="s",
            description="wall time of one DAG node run, by node",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
        )
        self.tokens = meter.create_counter("meshrl.tokens", unit="{token}", description="tokens processed, by phase")
        self.tokens_per_second = meter.create_gauge(
            "meshrl.tokens_per_second", unit="{token}/s", description="throughput of the last measured call, by phase"
        )
        self.weight_version = meter.create_gauge(
            "meshrl.weights.version", unit="{version}", description="weight version loaded, by replica"
        )
        self.weight_update_duration = meter.create_histogram(
            "meshrl.weights.update.duration",
            unit="s",
            description="time to publish or apply new weights",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
        )

    def record_step(self, seconds: float, **attributes: Any) -> None:
        self.step_duration.record(seconds, attributes or None)

    def record_node(self, node_id: str, seconds: float, *, node_type: str | None = None) -> None:
        attrs: dict[str, Any] = {NODE_ID: node_id}
        if node_type is not None:
            attrs[NODE_TYPE] = node_type
        self.node_duration.record(seconds, attrs)

    def record_tokens(self, count: int, seconds: float, *, phase: str, replica: str | None = None) -> None:
        """`count` tokens done in `seconds` by `phase` (generate, logprob, train)."""
        attrs: dict[str, Any] = {"meshrl.phase": phase}
        if replica is not None:
            attrs[REPLICA] = replica
        self.tokens.add(count, attrs)
        if seconds > 0:
            self.tokens_per_second.set(count / seconds, attrs)

    def set_weight_version(self, replica: str, version: int) -> None:
        self.weight_version.set(version, {REPLICA: replica})

    def record_weight_update(self, seconds: float, *, transport: str, replica: str | None = None) -> None:
        attrs: dict[str, Any] = {TRANSPORT: transport}
        if replica is not None:
            attrs[REPLICA] = replica
        self.weight_update_duration.record(seconds, attrs)


_cache: tuple[int, MeshrlMetrics] | None = None
_cache_lock = threading.Lock()


def metrics() -> MeshrlMetrics:
    """The instruments on the current meter (rebuilt after a new `setup_telemetry`)."""
    global _cache
    generation = runtime.generation()
    cached = _cache
    if cached is not None and cached[0] == generation:
        return cached[1]
    with _cache_lock:
        if _cache is None or _cache[0] != generation:
            _cache = (generation, MeshrlMetrics(runtime.meter()))
        return _cache[1]
