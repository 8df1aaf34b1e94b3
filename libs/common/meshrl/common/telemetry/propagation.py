"""Trace context across boundaries that are not gRPC: Ray actor calls, subprocesses, queues.

The caller does `actor.run.remote(..., trace_ctx=inject_context())`; the actor wraps its work in
`with span_from_carrier("rollout.generate", trace_ctx, **attrs):`. The carrier is a plain
dict[str, str] of W3C `traceparent` / `tracestate` / `baggage` (OTEL_PROPAGATORS is honoured).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind

from meshrl.common.telemetry import runtime


def inject_context(context: Context | None = None) -> dict[str, str]:
    """The current (or given) trace context as a carrier dict; empty when no span is active or
    tracing is off in this process."""
    carrier: dict[str, str] = {}
    if runtime.tracing_enabled():
        propagate.inject(carrier, context=context)
    return carrier


def extract_context(carrier: Mapping[str, str] | None) -> Context:
    """The context a carrier from `inject_context` describes (an empty context for None or {})."""
    return propagate.extract(dict(carrier or {}))


@contextmanager
def span_from_carrier(
    name: str, carrier: Mapping[str, str] | None, *, kind: SpanKind = SpanKind.SERVER, **attributes: Any
) -> Iterator[trace.Span]:
    """A current span `name`, child of the span the carrier came from; exceptions are recorded
    and set status ERROR. Attribute keys with dots go in as `**{"meshrl.step": 3}`."""
    if not runtime.tracing_enabled():
        yield trace.INVALID_SPAN
        return
    with runtime.tracer().start_as_current_span(
        name, context=extract_context(carrier), kind=kind, attributes=attributes or None
    ) as span:
        yield span
