"""Trace context across the bus: a request's `traceparent` in a wakeup, a link on the episode."""

from __future__ import annotations

import contextlib

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

# Defined with the instruments: storage stores it with the runs a request enqueues.
from runtime.instruments import current_traceparent as current_traceparent


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
