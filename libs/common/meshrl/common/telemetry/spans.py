"""Tagging the current span: every servicer puts its call's facts (keys, bytes, tokens) on the server span
that the telemetry interceptor opened. Called by the four services' servers and by the scheduler's nodes.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.util.types import AttributeValue


def tag_span(attributes: Mapping[str, AttributeValue]) -> None:
    """Adds `attributes` (keys from `meshrl.common.telemetry.attributes`) to the current span, when one records."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes(dict(attributes))
