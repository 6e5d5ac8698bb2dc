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

from opentelemetry import metrics, trace
from starlette.routing import BaseRoute, Match

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

        readers: list[Any] = []
        for name, exporter in metric_exporters:
            readers.append(PeriodicExportingMetricReader(exporter))
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
HTTP_REQUESTS = meter.create_counter("threadline.http.requests", description="by route, status")
HTTP_DURATION = meter.create_histogram("threadline.http.duration", unit="s")
WS_CONNECTIONS = meter.create_up_down_counter("threadline.ws.connections")
WS_FRAMES_IN = meter.create_counter("threadline.ws.frames_in", description="by frame type")
WS_CLOSES = meter.create_counter("threadline.ws.closes", description="by close code")
SSE_STREAMS = meter.create_up_down_counter(
    "threadline.sse.streams", description="open event streams (AG-UI, AI SDK, thread SSE)"
)
QUOTA_REFUSALS = meter.create_counter(
    "threadline.quota.refusals", description="commands and connections refused by a limit, by code"
)
SNAPSHOT_READS = meter.create_counter(
    "threadline.snapshot.reads",
    description="snapshots answered, by source: storage (a read) or cache (the gateway's)",
)


# Current HTTP semantic conventions (`http.request.method`, `http.response.status_code`,
# `url.path`, ...) unless the operator chose otherwise: the instrumentation's default is still
# the old names.
SEMCONV_OPT_IN = ("OTEL_SEMCONV_STABILITY_OPT_IN", "http")


def server_spans(app: Any, routes: Sequence[BaseRoute]) -> Any:
    """`app` wrapped in OpenTelemetry's ASGI middleware: a SERVER span per HTTP request and
    websocket, named `{method} {route template}`, its parent the caller's `traceparent`."""
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

    os.environ.setdefault(*SEMCONV_OPT_IN)

    def details(scope: Any) -> tuple[str, dict[str, Any]]:
        template = route_template(routes, scope)
        method = "WebSocket" if scope["type"] == "websocket" else scope.get("method", "HTTP")
        if template is None:
            return method, {}
        return f"{method} {template}", {"http.route": template}

    # One span per request, not one more per ASGI message of a stream or websocket.
    return OpenTelemetryMiddleware(
        app, default_span_details=details, exclude_spans=["receive", "send"]
    )


def route_template(routes: Sequence[BaseRoute], scope: Any) -> str | None:
    """The template of the route `scope` goes to (`/v1/threads/{thread_id}`), before routing."""
    for route in routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return str(getattr(route, "path", None) or "") or None
    return None


class RequestTelemetry:
    """ASGI middleware: two metrics per HTTP request, labelled by route template (the span is
    the ASGI instrumentation's, `server_spans`).

    Route templates (not paths) keep metric cardinality bounded; failures of the telemetry
    pipeline are swallowed so they can never fail a request.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_wrapper(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        start = time.perf_counter()
        try:
            await self.app(scope, receive, send_wrapper)
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
