"""Trace context across the bus: a request's `traceparent` in a wakeup, a link on the episode."""

from __future__ import annotations

import contextlib

from opentelemetry import propagate, trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator


def current_traceparent() -> str | None:
    """The W3C `traceparent` of the current span (a request's), None outside a sampled one."""
    carrier: dict[str, str] = {}
    try:
        propagate.inject(carrier)
    except Exception:  # telemetry never changes what is published
        return None
    return carrier.get("traceparent")


def request_links(traceparent: str | None) -> list[trace.Link]:
    """A span link to the request's span context, from its W3C `traceparent` (none if absent
    or malformed: a bad header from a client never changes a run)."""
    if not traceparent:
        return []
    with contextlib.suppress(Exception):
        context = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
        linked = trace.get_current_span(context).get_span_context()
        if linked.is_valid:
            return [trace.Link(linked, {"threadline.link": "request"})]
    return []
