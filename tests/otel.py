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


@dataclass
class Telemetry:
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader
    tracer_provider: TracerProvider

    def span_names(self) -> list[str]:
        return [s.name for s in self.spans.get_finished_spans()]

    def counter_points(self, name: str) -> list[tuple[dict[str, Any], float]]:
        data = self.metrics.get_metrics_data()
        points: list[tuple[dict[str, Any], float]] = []
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        for point in metric.data.data_points:
                            value = getattr(point, "value", None)
                            if value is None:
                                value = getattr(point, "count", 0)
                            points.append((dict(point.attributes or {}), value))
        return points


_installed: Telemetry | None = None


def install() -> Telemetry:
    global _installed
    if _installed is None:
        exporter = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(tracer_provider)
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        _installed = Telemetry(exporter, reader, tracer_provider)
    return _installed
