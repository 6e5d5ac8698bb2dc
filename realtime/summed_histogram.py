"""Histograms aggregated in the process and handed to the OpenTelemetry readers as they collect.

An SDK `Histogram.record` is a measurement object, its attributes cleaned and hashed, an
exemplar check and a locked aggregation: 6-15 µs on these boxes, and a run through the public
API records about two dozen (a publisher records one per bus batch, docs/benchmarks.md,
eleventh pass). A `SummedHistogram` keeps, per attribute set, what the SDK's explicit-bucket
aggregation keeps (bucket counts, sum, count, min, max) under a lock: about a microsecond.
The SDK has no observable histogram to report such totals through, so the readers Threadline
builds (`server.tracing`, and the tests') add them where a reader receives what it collected
(`MergedHistograms._receive_metrics`, the SDK's hook for reader subclasses): the same metric
name, unit, description, instrumentation scope, bucket boundaries (the SDK's defaults) and
cumulative temporality as the SDK's own histogram; Prometheus and OTLP see no difference.
These points carry no exemplars (Threadline's exporters never sent any).
"""

from __future__ import annotations

import math
import threading
import time
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.metrics import Meter

from realtime.summed_counter import Key, hashable

# The SDK's default explicit bucket boundaries (`ExplicitBucketHistogramAggregation`).
BOUNDARIES: tuple[float, ...] = (
    0.0,
    5.0,
    10.0,
    25.0,
    50.0,
    75.0,
    100.0,
    250.0,
    500.0,
    750.0,
    1000.0,
    2500.0,
    5000.0,
    7500.0,
    10000.0,
)


class _Point:
    __slots__ = ("count", "counts", "max", "min", "sum")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * buckets
        self.count = 0
        self.sum = 0.0
        self.min = math.inf
        self.max = -math.inf


class SummedHistogram:
    """`record` as on an SDK histogram; readers built with `MergedHistograms` collect it."""

    __slots__ = ("_lock", "_points", "boundaries", "description", "name", "scope", "start", "unit")

    def __init__(
        self,
        name: str,
        unit: str = "",
        description: str = "",
        scope: tuple[str, str | None, str | None] = ("", None, None),
        boundaries: Sequence[float] = BOUNDARIES,
    ) -> None:
        self.name, self.unit, self.description = name, unit, description
        self.scope = scope  # the meter's name, version and schema URL
        self.boundaries = tuple(boundaries)
        self.start = time.time_ns()
        self._points: dict[Key, _Point] = {}
        # Records come from every event loop's thread (and `asyncio.to_thread` work).
        self._lock = threading.Lock()

    def record(self, amount: float, attributes: Mapping[str, Any] | None = None) -> None:
        # As the SDK does: a value that is not finite, or negative, is not recorded.
        if not (amount >= 0 and math.isfinite(amount)):
            return
        key: Key = tuple(attributes.items()) if attributes else ()
        index = bisect_left(self.boundaries, amount)
        try:
            self._add(key, index, amount)
        except TypeError:  # an unhashable value (as `SummedCounter.add` handles it)
            self._add(hashable(key), index, amount)

    def _add(self, key: Key, index: int, amount: float) -> None:
        with self._lock:
            point = self._points.get(key)
            if point is None:
                point = self._points[key] = _Point(len(self.boundaries) + 1)
            point.counts[index] += 1
            point.count += 1
            point.sum += amount
            if amount < point.min:
                point.min = amount
            if amount > point.max:
                point.max = amount

    def points(self) -> list[tuple[dict[str, Any], list[int], int, float, float, float]]:
        """(attributes, bucket counts, count, sum, min, max) per attribute set, merged over
        the orders its attributes were given in."""
        with self._lock:
            items = [
                (key, list(p.counts), p.count, p.sum, p.min, p.max)
                for key, p in self._points.items()
            ]
        merged: dict[frozenset[tuple[str, Any]], list[Any]] = {}
        for key, counts, count, total, low, high in items:
            seen = merged.get(frozenset(key))
            if seen is None:
                merged[frozenset(key)] = [dict(key), counts, count, total, low, high]
                continue
            seen[1] = [a + b for a, b in zip(seen[1], counts, strict=True)]
            seen[2] += count
            seen[3] += total
            seen[4], seen[5] = min(seen[4], low), max(seen[5], high)
        return [(a, c, n, s, lo, hi) for a, c, n, s, lo, hi in merged.values()]


# Every histogram made by `summed_histogram`: what the readers add to their collections.
REGISTRY: list[SummedHistogram] = []


def summed_histogram(
    meter: Meter, name: str, unit: str = "", description: str = ""
) -> SummedHistogram:
    """A `SummedHistogram` in `meter`'s instrumentation scope, collected by every reader built
    with `MergedHistograms`."""
    histogram = SummedHistogram(
        name, unit, description, (meter.name, meter.version, meter.schema_url)
    )
    REGISTRY.append(histogram)
    return histogram


class MergedHistograms:
    """A mixin for an SDK `MetricReader` (first in the bases): what the reader collected, plus
    the points of `histograms` (the registry's by default), before it is exported or kept.
    The SDK calls `_receive_metrics` only when it collected something of its own: a
    collection made before any counter of the process was added to (a served process adds to
    them from its first request or run on) carries none of these points either."""

    def __init__(
        self, *args: Any, histograms: Iterable[SummedHistogram] | None = None, **kwargs: Any
    ) -> None:
        self._histograms = histograms
        super().__init__(*args, **kwargs)

    def _receive_metrics(
        self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any
    ) -> None:
        histograms = REGISTRY if self._histograms is None else self._histograms
        merged = merge(metrics_data, histograms)
        super()._receive_metrics(merged, timeout_millis=timeout_millis, **kwargs)  # type: ignore[misc]


def merge(metrics_data: Any, histograms: Iterable[SummedHistogram]) -> Any:
    """`metrics_data` (an SDK `MetricsData`) with each histogram that has points added to its
    scope's metrics, in its first resource's."""
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Histogram,
        HistogramDataPoint,
        Metric,
        MetricsData,
        ResourceMetrics,
        ScopeMetrics,
    )
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    now = time.time_ns()
    added: dict[tuple[str, str | None, str | None], list[Any]] = {}
    for histogram in histograms:
        points = [
            HistogramDataPoint(
                attributes=attributes,
                start_time_unix_nano=histogram.start,
                time_unix_nano=now,
                count=count,
                sum=total,
                bucket_counts=counts,
                explicit_bounds=list(histogram.boundaries),
                min=low,
                max=high,
                exemplars=[],
            )
            for attributes, counts, count, total, low, high in histogram.points()
        ]
        if points:
            data = Histogram(
                data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE
            )
            metric = Metric(histogram.name, histogram.description, histogram.unit, data)
            added.setdefault(histogram.scope, []).append(metric)
    if not added or not metrics_data.resource_metrics:
        return metrics_data
    resource_metrics = metrics_data.resource_metrics[0]
    scopes = []
    for scope in resource_metrics.scope_metrics:
        ours = added.pop((scope.scope.name, scope.scope.version, scope.scope.schema_url), [])
        scopes.append(ScopeMetrics(scope.scope, [*scope.metrics, *ours], scope.schema_url))
    for (name, version, schema_url), metrics in added.items():  # scopes the SDK had nothing of
        scope_id = InstrumentationScope(name, version, schema_url)
        scopes.append(ScopeMetrics(scope_id, metrics, schema_url or ""))
    first = ResourceMetrics(resource_metrics.resource, scopes, resource_metrics.schema_url)
    return MetricsData([first, *metrics_data.resource_metrics[1:]])
