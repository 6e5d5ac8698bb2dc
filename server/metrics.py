"""Prometheus exposition: the OpenTelemetry instruments bridged to /metrics, plus sampled gauges."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any, Protocol

import uvicorn
from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

log = logging.getLogger(__name__)

# A scrape waits this long for the queue-depth query; a slow database leaves the last values.
_SAMPLE_TIMEOUT = 2.0


class DepthSource(Protocol):
    async def queue_depth(self) -> dict[str, int]: ...


class Samples:
    """Values read when a scrape starts, reported by the observable gauges below.

    Observable-gauge callbacks are synchronous and run inside the exporter's collection, so
    the asynchronous reads (storage) happen just before it, in `sample`."""

    def __init__(self) -> None:
        self.queued_runs: int | None = None
        self.queued_items: int | None = None
        # Worker-held leases, read at collection time from the worker's episode map.
        self.episodes: Any = None

    def queue(self, _: CallbackOptions) -> Iterable[Observation]:
        if self.queued_runs is not None:
            yield Observation(self.queued_runs, {"kind": "run"})
        if self.queued_items is not None:
            yield Observation(self.queued_items, {"kind": "item"})

    def leases(self, _: CallbackOptions) -> Iterable[Observation]:
        if self.episodes is not None:
            yield Observation(len(self.episodes))


SAMPLES = Samples()
_meter = metrics.get_meter("threadline.server")
_meter.create_observable_gauge(
    "threadline.queue.depth",
    callbacks=[SAMPLES.queue],
    description="queued runs waiting for a worker (kind=run), queued input behind a run (item)",
)
_meter.create_observable_gauge(
    "threadline.worker.active_leases",
    callbacks=[SAMPLES.leases],
    description="run leases this worker holds (episodes in progress)",
)


def prometheus_reader() -> Any:
    """The OpenTelemetry reader that feeds prometheus_client's default registry."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader

    from runtime.instruments import MergedHistograms

    class PrometheusReader(MergedHistograms, PrometheusMetricReader):
        """The SDK's metrics and the summed histograms (realtime/summed_histogram)."""

    # No otel_scope_* labels: every instrument name is unique across the meters already.
    return PrometheusReader(scope_info_enabled=False)


async def sample(state: Any) -> None:
    """Refresh the sampled gauges from the app's components; failures keep the last values."""
    worker = getattr(state, "worker", None)
    SAMPLES.episodes = worker.episodes if worker is not None else None
    store: DepthSource | None = getattr(state, "store", None)
    if store is None or not hasattr(store, "queue_depth"):
        return
    try:
        depth = await asyncio.wait_for(store.queue_depth(), _SAMPLE_TIMEOUT)
    except Exception as exc:  # a scrape must answer even when storage is down
        log.debug("queue depth unavailable: %s", exc)
        return
    SAMPLES.queued_runs, SAMPLES.queued_items = depth["runs"], depth["items"]


async def metrics_endpoint(request: Request) -> Response:
    """`GET /metrics`: the Prometheus text format of every instrument this process records."""
    await sample(getattr(request.app.state, "source", request.app.state))
    # Collection walks every instrument synchronously; off the loop, so streams keep flowing.
    body = await asyncio.to_thread(generate_latest, REGISTRY)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


class _MetricsServer(uvicorn.Server):
    """A uvicorn server that leaves signals to the main one: the lifespan stops it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def metrics_server(app_state: Any, host: str, port: int) -> AsyncIterator[None]:
    """Serve only /metrics on its own port (THREADLINE_METRICS_PORT) while the block runs."""
    app = Starlette(routes=[Route("/metrics", metrics_endpoint, methods=["GET"])])
    app.state.source = app_state  # the main app's components, sampled at each scrape
    config = uvicorn.Config(app, log_config=None, lifespan="off")
    server = _MetricsServer(config)
    # Bound here, so a taken port fails start-up with its reason; connections wait in the
    # backlog until uvicorn accepts them.
    sock = socket.create_server((host, port), reuse_port=False)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="metrics-server")
    try:
        yield
    finally:
        server.should_exit = True
        await task
