"""Typed telemetry settings and how the standard OTEL_* environment variables change them.

`TelemetryConfig` is the `telemetry:` section of every service's config; `setup_telemetry`
(meshrl.common.telemetry.runtime) calls `resolve_config` so that an operator's OTEL_* variables
(OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_*, OTEL_TRACES_SAMPLER[_ARG], OTEL_SDK_DISABLED,
OTEL_METRICS_EXPORTER, OTEL_EXPORTER_PROMETHEUS_*) win over the file, as they do in any OTel SDK.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal

import pydantic
from opentelemetry.sdk.trace import sampling

from meshrl.common.config import StrictModel
from meshrl.common.errors import ConfigError

TraceExporter = Literal["file", "otlp", "otlp-http", "console", "none"]
MetricsExporter = Literal["otlp", "otlp-http", "console", "none"]
SamplerName = Literal[
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
]

# Probes (Kubernetes, grpcurl) call these without a trace; such calls get no root span of their own.
DEFAULT_UNTRACED_ROOT_SERVICES = (
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
)


class TelemetryConfig(StrictModel):
    """Where spans and metrics of one service process go. Defaults: tracing off, no metrics endpoint."""

    exporter: TraceExporter = pydantic.Field(
        "none",
        description="'file' (JSONL in the run folder, read by `meshrl trace`), 'otlp' (gRPC), 'otlp-http', "
        "'console' or 'none'",
    )
    path: str | None = pydantic.Field(None, description="the JSONL file of the file exporter, one span per line")
    endpoint: str | None = pydantic.Field(
        None,
        description="OTLP endpoint, e.g. http://127.0.0.1:4317 (gRPC) or http://127.0.0.1:4318 (HTTP, "
        "/v1/traces is appended when the URL has no path); OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT wins",
    )
    insecure: bool | None = pydantic.Field(None, description="OTLP gRPC without TLS (None: decided by the URL)")
    headers: dict[str, str] = pydantic.Field(default_factory=dict, description="extra OTLP request headers")
    sample_ratio: float = pydantic.Field(
        1.0, ge=0.0, le=1.0, description="fraction of step traces kept (whole traces: the root decides)"
    )
    sampler: SamplerName | None = pydantic.Field(
        None, description="an OTEL_TRACES_SAMPLER name; None: parentbased_traceidratio with sample_ratio"
    )
    batch: bool = pydantic.Field(True, description="export spans from a background batch (False: synchronously)")
    prometheus_port: int | None = pydantic.Field(
        None, ge=0, le=65535, description="serve Prometheus /metrics on this port (0: any free port)"
    )
    prometheus_host: str = pydantic.Field(
        "127.0.0.1",
        description="address the Prometheus endpoint binds (0.0.0.0 where a scraper on another host reads it)",
    )
    metrics_exporter: MetricsExporter = pydantic.Field("none", description="push metrics over OTLP or to the console")
    metrics_interval_s: float = pydantic.Field(10.0, gt=0, description="seconds between metric pushes")
    instance: str | None = pydantic.Field(
        None, description="which process of the service this is (a rollout replica id): service.instance.id, a lane"
    )
    resource_attributes: dict[str, str] = pydantic.Field(
        default_factory=dict, description="extra resource attributes added to every span and metric"
    )
    untraced_root_services: tuple[str, ...] = pydantic.Field(
        DEFAULT_UNTRACED_ROOT_SERVICES,
        description="gRPC services traced only when the caller's trace continues (health probes, reflection)",
    )

    @property
    def tracing(self) -> bool:
        return self.exporter != "none"

    @property
    def metrics(self) -> bool:
        return self.prometheus_port is not None or self.metrics_exporter != "none"


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def _otlp_kind(env: Mapping[str, str], signal: str, var: str) -> Literal["otlp", "otlp-http"]:
    protocol_var = f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL"
    name = protocol_var if env.get(protocol_var) else "OTEL_EXPORTER_OTLP_PROTOCOL"
    protocol = env.get(name, "grpc").strip().lower()
    if protocol == "grpc":
        return "otlp"
    if protocol == "http/protobuf":
        return "otlp-http"
    raise ConfigError(
        name, protocol, f"protocol not supported for {var}=otlp", "use 'grpc' or 'http/protobuf' (http/json is not)"
    )


def _trace_exporter_from_env(env: Mapping[str, str], current: str) -> str:
    raw = env.get("OTEL_TRACES_EXPORTER")
    if not raw:
        # OTEL_EXPORTER_OTLP_PROTOCOL still picks gRPC vs HTTP for a config that says "otlp".
        if current == "otlp" and (
            env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        ):
            return _otlp_kind(env, "TRACES", "exporter")
        return current
    first = raw.split(",")[0].strip().lower()
    if first == "otlp":
        return _otlp_kind(env, "TRACES", "OTEL_TRACES_EXPORTER")
    if first in ("file", "otlp-http", "console", "none"):
        return first
    raise ConfigError(
        "OTEL_TRACES_EXPORTER", raw, "unknown trace exporter", "use one of otlp, otlp-http, console, file, none"
    )


def _metrics_from_env(env: Mapping[str, str], update: dict[str, object]) -> None:
    raw = env.get("OTEL_METRICS_EXPORTER")
    if raw:
        names = {part.strip().lower() for part in raw.split(",") if part.strip()}
        unknown = names - {"otlp", "console", "prometheus", "none"}
        if unknown:
            raise ConfigError(
                "OTEL_METRICS_EXPORTER",
                raw,
                f"unknown metrics exporter(s) {sorted(unknown)}",
                "use otlp, prometheus, console or none",
            )
        if "otlp" in names:
            update["metrics_exporter"] = _otlp_kind(env, "METRICS", "OTEL_METRICS_EXPORTER")
        elif "console" in names:
            update["metrics_exporter"] = "console"
        else:
            update["metrics_exporter"] = "none"
        if "prometheus" in names:
            update["prometheus_port"] = 9464
        elif names == {"none"}:
            update["prometheus_port"] = None
    for var, field in (
        ("OTEL_EXPORTER_PROMETHEUS_PORT", "prometheus_port"),
        ("OTEL_EXPORTER_PROMETHEUS_HOST", "prometheus_host"),
    ):
        if env.get(var):
            update[field] = env[var]


def resolve_config(config: TelemetryConfig, env: Mapping[str, str] | None = None) -> TelemetryConfig:
    """Returns `config` with the standard OTEL_* environment variables applied (they win over the file)."""
    env = os.environ if env is None else env
    if _truthy(env.get("OTEL_SDK_DISABLED", "")):
        return config.model_copy(update={"exporter": "none", "metrics_exporter": "none", "prometheus_port": None})
    update: dict[str, object] = {"exporter": _trace_exporter_from_env(env, config.exporter)}
    if env.get("OTEL_TRACES_SAMPLER"):
        update["sampler"] = env["OTEL_TRACES_SAMPLER"].strip().lower()
    if env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        update["endpoint"] = None  # the exporter classes read (and, for HTTP, complete) the variable themselves
    if env.get("OTEL_BSP_SCHEDULE_DELAY") == "0":
        update["batch"] = False
    _metrics_from_env(env, update)
    data = config.model_dump() | update
    try:
        return TelemetryConfig.model_validate(data)
    except pydantic.ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise ConfigError(
            f"telemetry.{field}",
            err.get("input"),
            f"{err['msg']} (set from an OTEL_* environment variable)",
            "fix the variable",
        ) from None


def build_sampler(config: TelemetryConfig, env: Mapping[str, str] | None = None) -> sampling.Sampler:
    """The sampler named by `config.sampler` (OTEL_TRACES_SAMPLER_ARG is its ratio), else ParentBased(ratio)."""
    env = os.environ if env is None else env
    name = config.sampler
    ratio = config.sample_ratio
    if name is not None and name.endswith("traceidratio") and env.get("OTEL_TRACES_SAMPLER_ARG"):
        raw = env["OTEL_TRACES_SAMPLER_ARG"]
        try:
            ratio = float(raw)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise ConfigError(
                "OTEL_TRACES_SAMPLER_ARG", raw, "not a ratio in [0, 1]", "set e.g. OTEL_TRACES_SAMPLER_ARG=0.25"
            )
    if name is None or name == "parentbased_traceidratio":
        root: sampling.Sampler = sampling.ALWAYS_ON if ratio >= 1.0 else sampling.TraceIdRatioBased(ratio)
        return sampling.ParentBased(root)
    if name == "always_on":
        return sampling.ALWAYS_ON
    if name == "always_off":
        return sampling.ALWAYS_OFF
    if name == "traceidratio":
        return sampling.TraceIdRatioBased(ratio)
    if name == "parentbased_always_on":
        return sampling.ParentBased(sampling.ALWAYS_ON)
    return sampling.ParentBased(sampling.ALWAYS_OFF)
