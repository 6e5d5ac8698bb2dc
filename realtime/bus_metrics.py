"""OpenTelemetry instruments of the realtime layer; behaviour never depends on them."""

from __future__ import annotations

import asyncio
from typing import Any

from opentelemetry import metrics

from realtime.summed_counter import summed_counter
from realtime.summed_histogram import summed_histogram

meter = metrics.get_meter("threadline.realtime")

PUBLISHED = summed_counter(
    meter, "threadline.realtime.published", description="bus publishes by envelope kind"
)
PUBLISH_ERRORS = summed_counter(
    meter,
    "threadline.realtime.publish_errors",
    description="failed best-effort bus operations by kind",
)
DROPPED = summed_counter(
    meter,
    "threadline.realtime.dropped",
    description="messages dropped for subscribers that fell behind",
)
RECONNECTS = summed_counter(
    meter,
    "threadline.realtime.reconnects",
    description="bus connections re-established after a loss",
)
SLOW_CONSUMERS = summed_counter(
    meter, "threadline.realtime.slow_consumers", description="connection outboxes that overflowed"
)
PUBLISH_DURATION = summed_histogram(
    meter,
    "threadline.realtime.publish.duration",
    unit="s",
    description="one bus operation of the publisher (a batch is one), by first envelope kind",
)

LIMITER_FALLBACKS = summed_counter(
    meter,
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


class DeferredCounts:
    """Counter adds gathered per event-loop turn: `add` sums in a dict and the first add of a
    turn schedules one `safe_add` per (counter, attribute value) for the end of it, so a
    publisher streaming thousands of chunks a second makes a few counter calls per turn, not
    two per chunk (each costs the SDK an attribute hash). Totals are unchanged; they reach the
    counter a turn later. Outside a running loop, `add` adds at once."""

    def __init__(self, attribute: str) -> None:
        self._attribute = attribute
        self._pending: dict[tuple[Any, str], float] = {}
        self._scheduled = False

    def add(self, counter: Any, amount: float, value: str) -> None:
        key = (counter, value)
        pending = self._pending
        pending[key] = pending.get(key, 0) + amount
        if self._scheduled:
            return
        try:
            asyncio.get_running_loop().call_soon(self.flush)
        except RuntimeError:  # no running loop: nothing will flush later
            self.flush()
            return
        self._scheduled = True

    def flush(self) -> None:
        """Hand what was gathered to the counters now."""
        self._scheduled = False
        pending, self._pending = self._pending, {}
        for (counter, value), amount in pending.items():
            safe_add(counter, amount, {self._attribute: value})
