"""Trace and span ids on every log record, so a log line leads to its span and back.

Services call `install_log_correlation()` once after configuring logging (the gRPC server helper
does). Every LogRecord then has `trace_id` and `span_id` (hex, or "-" outside a span) for format
strings such as `LOG_FORMAT`; handlers whose format does not mention them get the ids appended to
lines logged inside a span.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from opentelemetry import trace

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [trace_id=%(trace_id)s span_id=%(span_id)s] %(message)s"
_NO_ID = "-"
_installed_factory: object | None = None


def _with_trace_ids(base_factory):
    def factory(*args, **kwargs) -> logging.LogRecord:
        record = base_factory(*args, **kwargs)
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            record.trace_id = format(ctx.trace_id, "032x")
            record.span_id = format(ctx.span_id, "016x")
        else:
            record.trace_id = record.span_id = _NO_ID
        return record

    return factory


class TraceIdFormatter(logging.Formatter):
    """Wraps a handler's formatter: lines logged inside a span end with `trace_id=… span_id=…`."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        text = self.inner.format(record)
        trace_id = getattr(record, "trace_id", _NO_ID)
        if trace_id == _NO_ID:
            return text
        return f"{text} trace_id={trace_id} span_id={getattr(record, 'span_id', _NO_ID)}"


def _mentions_ids(formatter: logging.Formatter | None) -> bool:
    fmt = getattr(getattr(formatter, "_style", None), "_fmt", None) or ""
    return "trace_id" in fmt


def install_log_correlation(handlers: Iterable[logging.Handler] | None = None) -> None:
    """Adds `trace_id`/`span_id` to every LogRecord (once per process) and makes `handlers`
    (default: the root logger's) print them; safe to call again."""
    global _installed_factory
    current = logging.getLogRecordFactory()
    if current is not _installed_factory:
        _installed_factory = _with_trace_ids(current)
        logging.setLogRecordFactory(_installed_factory)
    for handler in logging.getLogger().handlers if handlers is None else handlers:
        if not isinstance(handler.formatter, TraceIdFormatter) and not _mentions_ids(handler.formatter):
            handler.setFormatter(TraceIdFormatter(handler.formatter))
