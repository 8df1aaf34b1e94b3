"""TelemetryConfig and the standard OTEL_* environment variables (they win over the file)."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import sampling

from meshrl.common.errors import ConfigError
from meshrl.common.telemetry import TelemetryConfig, build_sampler, resolve_config


def test_defaults_trace_nothing():
    cfg = resolve_config(TelemetryConfig(), env={})
    assert cfg.exporter == "none" and not cfg.tracing and not cfg.metrics


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"OTEL_TRACES_EXPORTER": "otlp"}, "otlp"),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, "otlp-http"),
        (
            {
                "OTEL_TRACES_EXPORTER": "otlp",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            },
            "otlp",
        ),
        ({"OTEL_TRACES_EXPORTER": "console"}, "console"),
        ({"OTEL_TRACES_EXPORTER": "none"}, "none"),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, "none"),
    ],
)
def test_environment_picks_the_exporter(env, expected):
    assert resolve_config(TelemetryConfig(exporter="file", path="/tmp/x.jsonl"), env=env).exporter == expected


def test_protocol_variable_switches_a_configured_otlp_to_http():
    cfg = resolve_config(TelemetryConfig(exporter="otlp"), env={"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})
    assert cfg.exporter == "otlp-http"


def test_endpoint_variable_wins_over_the_file():
    cfg = TelemetryConfig(exporter="otlp", endpoint="http://collector:4317")
    assert resolve_config(cfg, env={}).endpoint == "http://collector:4317"
    assert resolve_config(cfg, env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://other:4317"}).endpoint is None


def test_bad_environment_values_name_the_variable():
    with pytest.raises(ConfigError) as err:
        resolve_config(TelemetryConfig(), env={"OTEL_TRACES_EXPORTER": "jaeger"})
    assert "OTEL_TRACES_EXPORTER" in str(err.value) and "jaeger" in str(err.value)
    with pytest.raises(ConfigError) as err:
        resolve_config(
            TelemetryConfig(), env={"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}
        )
    assert "OTEL_EXPORTER_OTLP_PROTOCOL" in str(err.value)
    with pytest.raises(ConfigError) as err:
        resolve_config(TelemetryConfig(), env={"OTEL_TRACES_SAMPLER": "sometimes"})
    assert "sampler" in str(err.value) and "sometimes" in str(err.value)


def test_metrics_variables():
    cfg = resolve_config(
        TelemetryConfig(), env={"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_PORT": "9999"}
    )
    assert cfg.prometheus_port == 9999 and cfg.metrics
    cfg = resolve_config(TelemetryConfig(prometheus_port=9000), env={"OTEL_METRICS_EXPORTER": "none"})
    assert cfg.prometheus_port is None and not cfg.metrics
    cfg = resolve_config(
        TelemetryConfig(), env={"OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
    )
    assert cfg.metrics_exporter == "otlp-http"
    with pytest.raises(ConfigError):
        resolve_config(TelemetryConfig(), env={"OTEL_EXPORTER_PROMETHEUS_PORT": "many"})


def test_sampler_from_ratio_and_environment():
    assert isinstance(build_sampler(TelemetryConfig(), env={}), sampling.ParentBased)
    assert "TraceIdRatioBased{0.25}" in build_sampler(TelemetryConfig(sample_ratio=0.25), env={}).get_description()
    env = {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"}
    sampler = build_sampler(resolve_config(TelemetryConfig(), env=env), env=env)
    assert sampler.get_description() == "TraceIdRatioBased{0.5}"
    env = {"OTEL_TRACES_SAMPLER": "always_off"}
    assert build_sampler(resolve_config(TelemetryConfig(), env=env), env=env) is sampling.ALWAYS_OFF
    env = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}
    with pytest.raises(ConfigError) as err:
        build_sampler(resolve_config(TelemetryConfig(), env=env), env=env)
    assert "OTEL_TRACES_SAMPLER_ARG" in str(err.value)


def test_out_of_range_ratio_is_a_config_error_from_load_config():
    from meshrl.common.config import load_config

    with pytest.raises(ConfigError) as err:
        load_config(TelemetryConfig, overrides=["sample_ratio=1.5"], env={})
    assert "sample_ratio" in str(err.value)
