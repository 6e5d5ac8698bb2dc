"""OpenTelemetry instruments of the realtime layer; behaviour never depends on them."""

from __future__ import annotations

from typing import Any

from opentelemetry import metrics

meter = metrics.get_meter("threadline.realtime")

PUBLISHED = meter.create_counter(
    "threadline.realtime.published", description="bus publishes by envelope kind"
)
PUBLISH_ERRORS = meter.create_counter(
    "threadline.realtime.publish_errors", description="failed best-effort bus operations by kind"
)
DROPPED = meter.create_counter(
    "threadline.realtime.dropped", description="messages dropped for subscribers that fell behind"
)
RECONNECTS = meter.create_counter(
    "threadline.realtime.reconnects", description="bus connections re-established after a loss"
)
SLOW_CONSUMERS = meter.create_counter(
    "threadline.realtime.slow_consumers", description="connection outboxes that overflowed"
)
PUBLISH_DURATION = meter.create_histogram(
    "threadline.realtime.publish.duration",
    unit="s",
    description="one bus operation of the publisher (a batch is one), by first envelope kind",
)

LIMITER_FALLBACKS = meter.create_counter(
    "threadline.realtime.limiter_fallbacks",
    description="quota counter calls counted by this process because Redis failed, by error",
)


def safe_add(counter: Any, amount: float, attributes: dict[str, Any] | None = None) -> None:
    """Record a metric; a broken telemetry pipeline must never change execution."""
    # Runs several times per streamed chunk and commit: a suppress object would cost more than
    # the no-op counter it guards.
    try:  # noqa: SIM105
        counter.add(amount, attributes or {})
    except Exception:
        pass


def safe_record(histogram: Any, value: float, attributes: dict[str, Any] | None = None) -> None:
    """Record a histogram value; like safe_add, never changes execution."""
    try:  # noqa: SIM105 - as safe_add, without a suppress object
        histogram.record(value, attributes or {})
    except Exception:
        pass
