"""The file exporter: finished spans as JSON lines, and the reader that turns them back into records.

`setup_telemetry` installs `JsonlSpanExporter` for `exporter: file`; the trace viewer
(`meshrl trace`, meshrl.scheduler.traceview) reads the files back with `read_span_files`.
One line is one span (`SpanRecord.to_dict` is the schema). Lines are appended with one
`write(2)` per batch on an O_APPEND descriptor, so several processes may share one file.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpanEvent:
    name: str
    time_ns: int
    attributes: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SpanRecord:
    """One finished span as stored in a JSONL trace file. Ids are lowercase hex (32 / 16 digits)."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: str  # INTERNAL, SERVER, CLIENT, PRODUCER, CONSUMER
    start_ns: int
    end_ns: int
    status: str  # UNSET, OK, ERROR
    status_message: str | None
    service: str
    instance: str | None
    attributes: Mapping[str, Any] = field(default_factory=dict)
    events: tuple[SpanEvent, ...] = ()

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)

    @property
    def is_error(self) -> bool:
        return self.status == "ERROR"

    @property
    def lane(self) -> str:
        """Where the span ran: `service` or `service/instance` (one rollout replica per lane)."""
        return f"{self.service}/{self.instance}" if self.instance else self.service

    def to_dict(self) -> dict[str, Any]:
        return {
            "trace_id": self.trace_id,
            "span_id": self.span_id,
            "parent_span_id": self.parent_span_id,
            "name": self.name,
            "kind": self.kind,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "status": self.status,
            "status_message": self.status_message,
            "service": self.service,
            "instance": self.instance,
            "attributes": dict(self.attributes),
            "events": [{"name": e.name, "time_ns": e.time_ns, "attributes": dict(e.attributes)} for e in self.events],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SpanRecord:
        return cls(
            trace_id=str(data["trace_id"]),
            span_id=str(data["span_id"]),
            parent_span_id=data.get("parent_span_id"),
            name=str(data["name"]),
            kind=str(data.get("kind", "INTERNAL")),
            start_ns=int(data["start_ns"]),
            end_ns=int(data["end_ns"]),
            status=str(data.get("status", "UNSET")),
            status_message=data.get("status_message"),
            service=str(data.get("service") or "unknown"),
            instance=data.get("instance"),
            attributes=dict(data.get("attributes") or {}),
            events=tuple(
                SpanEvent(str(e["name"]), int(e["time_ns"]), dict(e.get("attributes") or {}))
                for e in data.get("events") or ()
            ),
        )


def span_to_dict(span: ReadableSpan) -> dict[str, Any]:
    """A finished SDK span in the file schema (`SpanRecord.to_dict`); built directly because the
    exporter does this for every span."""
    ctx = span.context
    parent = span.parent
    resource = span.resource.attributes if span.resource is not None else {}
    status = span.status
    instance = resource.get("meshrl.instance")  # only when set: the SDK fills service.instance.id with a UUID
    return {
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_span_id": f"{parent.span_id:016x}" if parent is not None else None,
        "name": span.name,
        "kind": span.kind.name,
        "start_ns": span.start_time or 0,
        "end_ns": span.end_time or span.start_time or 0,
        "status": status.status_code.name,
        "status_message": status.description,
        "service": str(resource.get("service.name", "unknown")),
        "instance": str(instance) if instance is not None else None,
        "attributes": dict(span.attributes) if span.attributes else {},
        "events": [
            {"name": e.name, "time_ns": e.timestamp, "attributes": dict(e.attributes) if e.attributes else {}}
            for e in span.events
        ],
    }


_encode = json.JSONEncoder(separators=(",", ":"), default=str).encode


class JsonlSpanExporter(SpanExporter):
    """Appends each exported span to `path` as one JSON line (parent folders are created)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(_encode(span_to_dict(s)) + "\n" for s in spans)
        data = memoryview(lines.encode("utf-8"))
        with self._lock:
            if self._fd is None:
                return SpanExportResult.FAILURE
            try:
                while data:
                    written = os.write(self._fd, data)
                    data = data[written:]
            except OSError as exc:
                log.warning("could not append %d span(s) to %s: %s", len(spans), self.path, exc)
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # os.write is unbuffered: every exported span is already in the file

    def shutdown(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def read_span_file(path: str | os.PathLike[str]) -> list[SpanRecord]:
    """Reads one JSONL trace file; a torn last line (a killed process) is skipped with a warning."""
    records: list[SpanRecord] = []
    bad = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                records.append(SpanRecord.from_dict(json.loads(line)))
            except (ValueError, KeyError, TypeError):
                bad += 1
    if bad:
        log.warning("%s: skipped %d unreadable line(s)", path, bad)
    return records


def read_span_files(paths: Iterable[str | os.PathLike[str]]) -> list[SpanRecord]:
    """Reads several JSONL trace files into one list of records (file order, then line order)."""
    out: list[SpanRecord] = []
    for p in paths:
        out.extend(read_span_file(p))
    return out
