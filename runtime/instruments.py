"""OpenTelemetry instruments shared by the runtime and storage; behaviour never depends on them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import metrics, propagate, trace

# One definition for both layers (runtime may use realtime, never the reverse).
from realtime.bus_metrics import safe_add as safe_add
from realtime.bus_metrics import safe_record as safe_record
from realtime.summed_counter import summed_counter as summed_counter
from realtime.summed_histogram import MergedHistograms as MergedHistograms
from realtime.summed_histogram import summed_histogram as summed_histogram

tracer = trace.get_tracer("threadline.runtime")
meter = metrics.get_meter("threadline.runtime")

RUNS = summed_counter(meter, "threadline.runs", description="run events by outcome")
MODEL_CALL_DURATION = summed_histogram(
    meter, "threadline.model_call.duration", unit="s", description="model call wall time"
)
TOKENS = summed_counter(meter, "threadline.tokens", description="model token usage by kind")
TOOL_CALL_DURATION = summed_histogram(
    meter, "threadline.tool_call.duration", unit="s", description="tool execution wall time"
)
TOOL_ERRORS = summed_counter(meter, "threadline.tool_call.errors")
QUEUE_EVENTS = summed_counter(meter, "threadline.queue.events", description="admissions etc.")
LEASE_EVENTS = summed_counter(meter, "threadline.lease.events", description="acquire/lost/...")
STORAGE_RETRIES = summed_counter(meter, "threadline.storage.retries")
HISTORY_REWRITTEN_FAILURES = summed_counter(
    meter,
    "threadline.history_rewritten.failures",
    description="history_rewritten observer failures after a committed rewrite",
)
# OpenTelemetry GenAI semantic conventions (client metrics).
GEN_AI_TOKEN_USAGE = summed_histogram(
    meter, "gen_ai.client.token.usage", unit="{token}", description="tokens used per model call"
)
GEN_AI_OPERATION_DURATION = summed_histogram(
    meter,
    "gen_ai.client.operation.duration",
    unit="s",
    description="time spent waiting on the model",
)
PROVIDER_FAILURES = summed_counter(meter, "threadline.provider.failures")
# Latencies an operator alerts on (docs/operations.md, "Metrics"): labels are outcomes only.
RUN_DURATION = summed_histogram(
    meter,
    "threadline.run.duration",
    unit="s",
    description="from a run's creation to its end, by outcome",
)
STEP_DURATION = summed_histogram(
    meter, "threadline.step.duration", unit="s", description="one step: model call, tools, commit"
)
# Webhook delivery attempts (runtime/hooks/delivery.py), labelled by `outcome` only: delivered,
# retried (failed, tried again later), dead (failed, dead-lettered), taken_over (the claim was
# lost before the attempt was logged: another worker posts it again).
WEBHOOK_ATTEMPTS = summed_counter(
    meter, "threadline.webhook.attempts", description="webhook delivery attempts by outcome"
)
WEBHOOK_ATTEMPT_DURATION = summed_histogram(
    meter,
    "threadline.webhook.attempt.duration",
    unit="s",
    description="one webhook POST, from resolving the address to the answer read, by outcome",
)


def start_span(
    name: str,
    start_time: int | None = None,
    kind: trace.SpanKind = trace.SpanKind.INTERNAL,
    **attributes: Any,
) -> trace.Span:
    """A span ended by the caller, for work whose end is not the end of a `with` block
    (`start_time`: nanoseconds since the epoch, default now)."""
    return tracer.start_span(name, attributes=attributes, start_time=start_time, kind=kind)


def fail_span(current: trace.Span, exc: BaseException | str) -> None:
    """Mark `current` failed; never raises (telemetry must not change execution)."""
    with contextlib.suppress(Exception):
        if isinstance(exc, BaseException):
            current.record_exception(exc)
            current.set_attribute("error.type", type(exc).__name__)
        current.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))


@contextmanager
def span(name: str, **attributes: Any) -> Iterator[trace.Span]:
    """A span around the body; the SDK's processors contain exporter failures, and exceptions
    of the body propagate unchanged (recorded on the span)."""
    with tracer.start_as_current_span(name, attributes=attributes) as current:
        yield current


@contextmanager
def linked_span(
    name: str, links: Sequence[trace.Link], attributes: dict[str, Any]
) -> Iterator[trace.Span]:
    """`span` with links to other traces (an episode to the request that started its run)."""
    with tracer.start_as_current_span(name, attributes=attributes, links=links) as current:
        yield current


def current_traceparent() -> str | None:
    """The W3C `traceparent` of the current span (a request's), None outside a sampled one:
    carried by wakeups and stored with the runs a request enqueues or resumes."""
    carrier: dict[str, str] = {}
    try:
        propagate.inject(carrier)
    except Exception:  # telemetry never changes what is published or committed
        return None
    return carrier.get("traceparent")
