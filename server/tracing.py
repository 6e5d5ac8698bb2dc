"""OpenTelemetry SDK set-up from the standard OTEL_* variables; exporters never break the server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, propagate, trace
from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware, asgi_getter
from starlette.routing import BaseRoute, Match

from runtime.instruments import MergedHistograms, summed_counter, summed_histogram

log = logging.getLogger(__name__)

_SHUTDOWN_TIMEOUT = 5.0
# The global providers can be set once per process; later apps (tests) reuse the first ones.
_installed: Telemetry | None = None


@dataclass
class Telemetry:
    """The providers this process installed (empty when disabled or already installed)."""

    tracer_provider: Any = None
    meter_provider: Any = None
    exporters: list[str] = field(default_factory=list)

    async def shutdown(self) -> None:
        """Flush and stop exporters, bounded: an unreachable collector never blocks shutdown."""
        for provider in (self.tracer_provider, self.meter_provider):
            if provider is None:
                continue
            try:
                await asyncio.wait_for(asyncio.to_thread(provider.shutdown), _SHUTDOWN_TIMEOUT)
            except Exception as exc:  # telemetry is best effort by design
                log.warning("telemetry shutdown failed: %s", exc)


def _selected(variable: str) -> list[str]:
    # Threadline defaults to no exporter (the OTel default would be otlp to localhost).
    raw = os.environ.get(variable, "none")
    names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    return [n for n in names if n != "none"]


def _disabled() -> bool:
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def configure_telemetry(service_name: str = "threadline", *, prometheus: bool = False) -> Telemetry:
    """Install tracer and meter providers per OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER,
    and with `prometheus` a reader that feeds /metrics (server/metrics.py).

    Supported exporters: `none` (default), `console` (to stderr, so stdout stays clean for
    commands) and `otlp` (HTTP/protobuf, endpoint from OTEL_EXPORTER_OTLP_*). An exporter that
    cannot be built is logged and skipped; export failures are handled inside the SDK's batch
    processors and never reach a request or a run.
    """
    global _installed
    if _installed is not None:
        return Telemetry()
    if _disabled():
        _installed = Telemetry()
        return Telemetry()
    try:
        telemetry = _configure(service_name, prometheus)
    except Exception as exc:
        log.warning("telemetry disabled: set-up failed: %s", exc)
        telemetry = Telemetry()
    _installed = telemetry
    return telemetry


def _configure(service_name: str, prometheus: bool) -> Telemetry:
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource

    resource = Resource.create({"service.name": service_name}).merge(
        OTELResourceDetector().detect()
    )
    telemetry = Telemetry()
    span_exporters = [e for e in map(_span_exporter, _selected("OTEL_TRACES_EXPORTER")) if e]
    if span_exporters:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        tracer_provider = TracerProvider(resource=resource)
        for name, exporter in span_exporters:
            tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
            telemetry.exporters.append(f"traces:{name}")
        trace.set_tracer_provider(tracer_provider)
        telemetry.tracer_provider = tracer_provider

    metric_exporters = [e for e in map(_metric_exporter, _selected("OTEL_METRICS_EXPORTER")) if e]
    if metric_exporters or prometheus:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        class ExportingReader(MergedHistograms, PeriodicExportingMetricReader):
            """Exports the SDK's metrics and the summed histograms (realtime/summed_histogram)."""

        readers: list[Any] = []
        for name, exporter in metric_exporters:
            readers.append(ExportingReader(exporter))
            telemetry.exporters.append(f"metrics:{name}")
        if prometheus:
            from server.metrics import prometheus_reader

            readers.append(prometheus_reader())
            telemetry.exporters.append("metrics:prometheus")
        meter_provider = MeterProvider(resource=resource, metric_readers=readers)
        metrics.set_meter_provider(meter_provider)
        telemetry.meter_provider = meter_provider
    return telemetry


def _span_exporter(name: str) -> tuple[str, Any] | None:
    try:
        if name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            return name, ConsoleSpanExporter(out=sys.stderr)
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            return name, OTLPSpanExporter()
        log.warning("unknown OTEL_TRACES_EXPORTER %r ignored", name)
    except Exception as exc:
        log.warning("trace exporter %r unavailable: %s", name, exc)
    return None


def _metric_exporter(name: str) -> tuple[str, Any] | None:
    try:
        if name == "console":
            from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

            return name, ConsoleMetricExporter(out=sys.stderr)
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )

            return name, OTLPMetricExporter()
        log.warning("unknown OTEL_METRICS_EXPORTER %r ignored", name)
    except Exception as exc:
        log.warning("metric exporter %r unavailable: %s", name, exc)
    return None


tracer = trace.get_tracer("threadline.server")
meter = metrics.get_meter("threadline.server")
HTTP_REQUESTS = summed_counter(meter, "threadline.http.requests", description="by route, status")
HTTP_DURATION = summed_histogram(meter, "threadline.http.duration", unit="s")
WS_CONNECTIONS = meter.create_up_down_counter("threadline.ws.connections")
WS_FRAMES_IN = summed_counter(meter, "threadline.ws.frames_in", description="by frame type")
WS_CLOSES = summed_counter(meter, "threadline.ws.closes", description="by close code")
SSE_STREAMS = meter.create_up_down_counter(
    "threadline.sse.streams", description="open event streams (AG-UI, AI SDK, thread SSE)"
)
QUOTA_REFUSALS = summed_counter(
    meter,
    "threadline.quota.refusals",
    description="commands and connections refused by a limit, by code",
)
SNAPSHOT_READS = summed_counter(
    meter,
    "threadline.snapshot.reads",
    description="snapshots answered, by source: storage (a read) or cache (the gateway's)",
)


# Current HTTP semantic conventions (`http.request.method`, `http.response.status_code`,
# `url.path`, ...) unless the operator chose otherwise: the instrumentation's default is still
# the old names.
SEMCONV_OPT_IN = ("OTEL_SEMCONV_STABILITY_OPT_IN", "http")


class HttpTelemetry:
    """Outermost ASGI middleware: the SERVER span of every HTTP request and websocket, and the
    two request metrics (`threadline.http.requests`, `threadline.http.duration`).

    With a tracer provider installed, the span is OpenTelemetry's ASGI middleware's: named
    `{method} {route template}`, its parent the caller's `traceparent`. With none (tracing off,
    the default), a span would not be recorded, so the instrumentation is skipped and only what
    it would have left behind is kept: the caller's propagated context (trace and baggage)
    becomes the current one, so log lines and the runs a request enqueues still carry the
    caller's trace. That is most of the middleware stack's cost per request (docs/benchmarks.md).
    The instrumentation's own `http.server.*` metrics are not recorded (the two above are the
    documented ones). Route templates, not paths, keep the metrics' cardinality bounded, and a
    failure of the telemetry pipeline never fails a request.
    """

    def __init__(self, app: Any, routes: Sequence[BaseRoute]) -> None:
        os.environ.setdefault(*SEMCONV_OPT_IN)
        self.app = app

        def details(scope: Any) -> tuple[str, dict[str, Any]]:
            template = route_template(routes, scope)
            method = "WebSocket" if scope["type"] == "websocket" else scope.get("method", "HTTP")
            if template is None:
                return method, {}
            return f"{method} {template}", {"http.route": template}

        # One span per request, not one more per ASGI message of a stream or websocket.
        self.traced = OpenTelemetryMiddleware(
            app,
            default_span_details=details,
            exclude_spans=["receive", "send"],
            meter_provider=metrics.NoOpMeterProvider(),
        )

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._measured(scope, receive, send)
        elif kind == "websocket":
            await self._spanned(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _spanned(self, scope: Any, receive: Any, send: Any) -> None:
        if tracing_on():
            await self.traced(scope, receive, send)
            return
        token = otel_context.attach(propagate.extract(scope, getter=asgi_getter))
        try:
            await self.app(scope, receive, send)
        finally:
            otel_context.detach(token)

    async def _measured(self, scope: Any, receive: Any, send: Any) -> None:
        status = 500

        async def send_wrapper(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        start = time.perf_counter()
        try:
            await self._spanned(scope, receive, send_wrapper)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            attributes = {
                "http.method": scope["method"],
                "http.route": route,
                "http.status_code": status,
            }
            with contextlib.suppress(Exception):
                HTTP_REQUESTS.add(1, attributes)
                HTTP_DURATION.record(time.perf_counter() - start, attributes)


def tracing_on() -> bool:
    """Whether spans are recorded: a tracer provider was installed (by `configure_telemetry`
    or by the embedding application), not the API's no-op default."""
    return not isinstance(trace.get_tracer_provider(), _NO_TRACING)


_NO_TRACING = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


def route_template(routes: Sequence[BaseRoute], scope: Any) -> str | None:
    """The template of the route `scope` goes to (`/v1/threads/{thread_id}`), before routing."""
    for route in routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return str(getattr(route, "path", None) or "") or None
    return None
