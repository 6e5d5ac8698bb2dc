"""realtime/summed_histogram: what a reader built with `MergedHistograms` collects is what the
SDK's own histogram gives for the same records (points, bounds, name, unit, scope)."""

from __future__ import annotations

import math
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    InMemoryMetricReader,
)

from realtime.summed_histogram import (
    REGISTRY,
    MergedHistograms,
    SummedHistogram,
    summed_histogram,
)

VALUES = [0.0, 0.003, 5.0, 5.000001, 42.0, 999.0, 10000.0, 12345.6]


class Reader(MergedHistograms, InMemoryMetricReader):
    pass


def collected(reader: InMemoryMetricReader, name: str) -> tuple[Any, Any, Histogram]:
    data = reader.get_metrics_data()
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    assert isinstance(metric.data, Histogram)
                    return scope.scope, metric, metric.data
    raise AssertionError(f"{name} was not collected")


def by_attributes(data: Histogram) -> dict[frozenset[tuple[str, Any]], tuple[Any, ...]]:
    return {
        frozenset((p.attributes or {}).items()): (
            list(p.bucket_counts),
            list(p.explicit_bounds),
            p.count,
            p.sum,
            p.min,
            p.max,
        )
        for p in data.data_points
    }


def test_the_points_are_the_sdk_histograms_points() -> None:
    sdk_reader = InMemoryMetricReader()
    sdk_meter = MeterProvider(metric_readers=[sdk_reader]).get_meter("threadline.test", "1.0")
    sdk = sdk_meter.create_histogram("threadline.test.duration", unit="s", description="d")
    ours_list: list[SummedHistogram] = []
    reader = Reader(histograms=ours_list)
    meter = MeterProvider(metric_readers=[reader]).get_meter("threadline.test", "1.0")
    ours = summed_histogram(meter, "threadline.test.duration", unit="s", description="d")
    REGISTRY.remove(ours)  # this test's reader only
    ours_list.append(ours)
    meter.create_counter("threadline.test.other").add(1)  # the SDK collects something too
    for index, value in enumerate(VALUES):
        attributes: dict[str, Any] = {"kind": "chunk", "backend": "redis"}
        if index % 2:
            attributes = {"backend": "redis", "kind": "chunk"}  # the same set, another order
        if index % 3 == 0:
            attributes = {}
        sdk.record(value, attributes)
        ours.record(value, attributes)
    for reject in (-1.0, math.nan, math.inf):
        sdk.record(reject)
        ours.record(reject)
    sdk_scope, sdk_metric, sdk_data = collected(sdk_reader, "threadline.test.duration")
    scope, metric, data = collected(reader, "threadline.test.duration")
    assert (scope.name, scope.version) == (sdk_scope.name, sdk_scope.version)
    assert (metric.unit, metric.description) == (sdk_metric.unit, sdk_metric.description)
    assert data.aggregation_temporality == sdk_data.aggregation_temporality
    assert data.aggregation_temporality == AggregationTemporality.CUMULATIVE
    assert by_attributes(data) == by_attributes(sdk_data)
    # Cumulative: a later collection counts everything since the start.
    sdk.record(7.0)
    ours.record(7.0)
    later = by_attributes(collected(reader, "threadline.test.duration")[2])
    assert later == by_attributes(collected(sdk_reader, "threadline.test.duration")[2])
    # The SDK's other metrics are still there, in the same scope.
    data_all = reader.get_metrics_data()
    assert data_all is not None
    names = {m.name for s in data_all.resource_metrics[0].scope_metrics for m in s.metrics}
    assert names == {"threadline.test.duration", "threadline.test.other"}


def test_a_histogram_of_another_scope_gets_a_scope_of_its_own_and_lists_are_kept() -> None:
    other = SummedHistogram("threadline.other.duration", "s", "", ("threadline.other", None, None))
    reader = Reader(histograms=[other])
    meter = MeterProvider(metric_readers=[reader]).get_meter("threadline.test")
    meter.create_counter("threadline.test.other").add(1)
    other.record(1.5, {"tags": ["a", "b"]})
    other.record(2.5, {"tags": ["a", "b"]})
    scope, _, data = collected(reader, "threadline.other.duration")
    assert scope.name == "threadline.other"
    [point] = data.data_points
    assert (point.count, point.sum, dict(point.attributes or {})) == (2, 4.0, {"tags": ("a", "b")})


def test_nothing_recorded_adds_nothing() -> None:
    quiet = SummedHistogram("threadline.quiet.duration")
    reader = Reader(histograms=[quiet])
    meter = MeterProvider(metric_readers=[reader]).get_meter("threadline.test")
    meter.create_counter("threadline.test.other").add(1)
    data = reader.get_metrics_data()
    assert data is not None
    names = {m.name for s in data.resource_metrics[0].scope_metrics for m in s.metrics}
    assert names == {"threadline.test.other"}
