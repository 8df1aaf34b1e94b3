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


MS = 1_000_000
T0 = 1_700_000_000_000_000_000


def _span(trace_id, span_id, parent, name, service, start_ms, end_ms, *, instance=None, kind="INTERNAL", **extra):
    record = {
        "trace_id": trace_id,
        "span_id": span_id,
        "parent_span_id": parent,
        "name": name,
        "kind": kind,
        "start_ns": T0 + int(start_ms * MS),
        "end_ns": T0 + int(end_ms * MS),
        "status": "UNSET",
        "status_message": None,
        "service": service,
        "instance": instance,
        "attributes": extra.pop("attributes", {}),
        "events": [],
    }
    record.update(extra)
    return record


def synthetic_step(step: int, offset_ms: float, *, fail_reward: bool = False) -> dict[str, list[dict]]:
    """One GRPO-like step across scheduler, two rollout replicas, the data buffer and the trainer,
    as the file exporter would have written it, keyed by span file name."""
    tid = f"{step:032x}"

    def sid(n: int) -> str:
        return f"{step:08x}{n:08x}"

    o = offset_ms
    gen = "meshrl.rollout.v1.RolloutService/Generate"
    train = "meshrl.trainer.v1.TrainerService/TrainStep"
    write = "meshrl.databuffer.v1.DataBufferService/Put"
    read = "meshrl.databuffer.v1.DataBufferService/Get"
    reward = _span(
        tid, sid(8), sid(1), "node reward", "scheduler", o + 600, o + 650, attributes={"meshrl.node_id": "reward"}
    )
    if fail_reward:
        reward["status"] = "ERROR"
        reward["status_message"] = "KeyError: rewards missing for group 4"
        reward["events"] = [
            {"name": "exception", "time_ns": reward["end_ns"], "attributes": {"exception.type": "KeyError"}}
        ]
    return {
        "scheduler.jsonl": [
            _span(tid, sid(1), None, f"step {step}", "scheduler", o, o + 1000, attributes={"meshrl.step": step}),
            _span(
                tid,
                sid(2),
                sid(1),
                "node rollout",
                "scheduler",
                o + 5,
                o + 600,
                attributes={"meshrl.node_id": "rollout"},
            ),
            _span(tid, sid(3), sid(2), gen, "scheduler", o + 10, o + 590, kind="CLIENT"),
            _span(tid, sid(4), sid(2), gen, "scheduler", o + 10, o + 450, kind="CLIENT"),
            reward,
            _span(
                tid,
                sid(9),
                sid(1),
                "node actor_train",
                "scheduler",
                o + 650,
                o + 980,
                attributes={"meshrl.node_id": "actor_train"},
            ),
            _span(tid, sid(10), sid(9), train, "scheduler", o + 655, o + 975, kind="CLIENT"),
        ],
        "rollout-r0.jsonl": [
            _span(tid, sid(5), sid(3), gen, "rollout", o + 12, o + 588, instance="r0", kind="SERVER"),
            _span(tid, sid(6), sid(5), write, "rollout", o + 560, o + 585, instance="r0", kind="CLIENT"),
        ],
        "rollout-r1.jsonl": [
            _span(tid, sid(7), sid(4), gen, "rollout", o + 12, o + 448, instance="r1", kind="SERVER"),
        ],
        "trainer.jsonl": [
            _span(tid, sid(11), sid(10), train, "trainer", o + 657, o + 973, kind="SERVER"),
            _span(tid, sid(12), sid(11), read, "trainer", o + 660, o + 700, kind="CLIENT"),
            _span(tid, sid(14), sid(11), "trainer.forward_backward", "trainer", o + 700, o + 970),
        ],
        "databuffer.jsonl": [
            _span(
                tid,
                sid(13),
                sid(12),
                read,
                "databuffer",
                o + 662,
                o + 698,
                kind="SERVER",
                attributes={"meshrl.bytes": 4096},
            ),
            _span(tid, sid(15), sid(6), write, "databuffer", o + 562, o + 583, kind="SERVER"),
        ],
    }


@pytest.fixture
def synthetic_run(tmp_path):
    """A run folder with two step traces (step 2's reward node fails) in five span files."""
    import json

    files: dict[str, list[dict]] = {}
    for step, offset, fail in ((1, 0, False), (2, 1500, True)):
        for name, records in synthetic_step(step, offset, fail_reward=fail).items():
            files.setdefault(name, []).extend(records)
    traces = tmp_path / "run" / "traces"
    traces.mkdir(parents=True)
    for name, records in files.items():
        (traces / name).write_text("".join(json.dumps(r) + "\n" for r in records))
    return tmp_path / "run"
