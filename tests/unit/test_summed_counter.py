"""realtime/summed_counter: adds summed per attribute set, read by a real SDK reader as a
monotonic cumulative sum under the counter's name."""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint, Sum

from realtime.summed_counter import SummedCounter, summed_counter


def collected(
    reader: InMemoryMetricReader, name: str
) -> tuple[Sum, dict[frozenset[tuple[str, Any]], float]]:
    data = reader.get_metrics_data()
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    assert isinstance(metric.data, Sum)
                    points: dict[frozenset[tuple[str, Any]], float] = {}
                    for point in metric.data.data_points:
                        assert isinstance(point, NumberDataPoint)
                        points[frozenset((point.attributes or {}).items())] = point.value
                    return metric.data, points
    raise AssertionError(f"{name} was not collected")


def test_a_reader_sees_the_totals_per_attribute_set_as_a_monotonic_sum() -> None:
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    counter = summed_counter(meter, "threadline.test.events", unit="1", description="events")
    counter.add(1, {"event": "started"})
    counter.add(2, {"event": "started"})
    counter.add(1, {"event": "completed", "kind": "run"})
    counter.add(4, {"kind": "run", "event": "completed"})  # the same set, another order
    counter.add(1)
    data, points = collected(reader, "threadline.test.events")
    assert data.is_monotonic is True
    assert points == {
        frozenset({("event", "started")}): 3,
        frozenset({("event", "completed"), ("kind", "run")}): 5,
        frozenset(): 1,
    }
    counter.add(10, {"event": "started"})
    assert collected(reader, "threadline.test.events")[1][frozenset({("event", "started")})] == 13


def test_negative_adds_are_dropped_and_lists_are_counted() -> None:
    counter = SummedCounter()
    counter.add(-1, {"event": "x"})
    counter.add(2, {"tags": ["a", "b"]})
    counter.add(1, {"tags": ["a", "b"]})
    assert counter.totals() == {frozenset({("tags", ("a", "b"))}): 3}


def test_adds_from_many_threads_are_all_counted() -> None:
    counter = SummedCounter()

    def work() -> None:
        for _ in range(20_000):
            counter.add(1, {"event": "x"})

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counter.totals() == {frozenset({("event", "x")}): 80_000}
