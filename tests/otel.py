"""Process-wide in-memory OpenTelemetry pipeline for tests (global providers can be set once)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from realtime.summed_histogram import MergedHistograms


class MergedReader(MergedHistograms, InMemoryMetricReader):
    """The in-memory reader with the summed histograms, as the server's readers have them."""


def _point_value(point: object, otherwise: str) -> float:
    """A counter point's `value`, else a histogram point's `otherwise` (`sum` or `count`)."""
    value = getattr(point, "value", None)
    return float(value if value is not None else getattr(point, otherwise, 0))


@dataclass
class Telemetry:
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader
    tracer_provider: TracerProvider

    def span_names(self) -> list[str]:
        return [s.name for s in self.spans.get_finished_spans()]

    def spans_where(self, name: str, **attributes: Any) -> list[Any]:
        """Finished spans called `name` whose attributes include `attributes`: a test asserts
        on its own spans even though the provider is shared by the whole session."""
        return [
            s
            for s in self.spans.get_finished_spans()
            if s.name == name
            and all((s.attributes or {}).get(k) == v for k, v in attributes.items())
        ]

    def totals(self, name: str) -> dict[frozenset[tuple[str, Any]], float]:
        """Cumulative value per attribute set of metric `name` (counters: sums; histograms:
        sums of recorded values)."""
        data = self.metrics.get_metrics_data()
        totals: dict[frozenset[tuple[str, Any]], float] = {}
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        for point in metric.data.data_points:
                            value = _point_value(point, "sum")
                            key = frozenset(_hashable(dict(point.attributes or {})).items())
                            totals[key] = totals.get(key, 0) + value
        return totals

    def mark(self, *names: str) -> Mark:
        """The current totals of `names`; `Mark.delta` later gives what this test added. The
        MeterProvider is process-global and cumulative, so absolute values include what earlier
        tests (other store parametrisations) recorded."""
        return Mark(self, {name: self.totals(name) for name in names})

    def counter_points(self, name: str) -> list[tuple[dict[str, Any], float]]:
        data = self.metrics.get_metrics_data()
        points: list[tuple[dict[str, Any], float]] = []
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        for point in metric.data.data_points:
                            value = _point_value(point, "count")
                            points.append((dict(point.attributes or {}), value))
        return points


def _hashable(attributes: dict[str, Any]) -> dict[str, Any]:
    return {k: tuple(v) if isinstance(v, list | tuple) else v for k, v in attributes.items()}


@dataclass
class Mark:
    telemetry: Telemetry
    before: dict[str, dict[frozenset[tuple[str, Any]], float]]

    def delta(self, name: str, **attributes: Any) -> float:
        """How much metric `name` grew since the mark, over the attribute sets that include
        `attributes`."""
        wanted = set(attributes.items())
        now = self.telemetry.totals(name)
        old = self.before[name]
        return sum(value - old.get(key, 0) for key, value in now.items() if wanted <= set(key))


_installed: Telemetry | None = None


def install() -> Telemetry:
    global _installed
    if _installed is None:
        exporter = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(tracer_provider)
        reader = MergedReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        _installed = Telemetry(exporter, reader, tracer_provider)
    return _installed
