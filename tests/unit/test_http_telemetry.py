"""server/tracing.HttpTelemetry: the caller's trace stays current with tracing off, the request
metrics carry the route template and the status, and spans are the instrumentation's when on."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import pytest
from opentelemetry import baggage, trace
from starlette.routing import Route

from runtime.instruments import current_traceparent
from server import tracing


class Recorder:
    """A counter or histogram stand-in: what was recorded, with which attributes."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, dict[str, Any]]] = []

    def add(self, amount: float, attributes: dict[str, Any]) -> None:
        self.calls.append((amount, attributes))

    record = add


async def endpoint(scope: Any, receive: Any, send: Any) -> None:
    seen.append((trace.get_current_span().get_span_context(), current_traceparent()))
    seen_baggage.append(baggage.get_baggage("tenant"))
    await send({"type": "http.response.start", "status": 201, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


seen: list[tuple[Any, str | None]] = []
seen_baggage: list[object] = []
ROUTES = [Route("/v1/threads/{thread_id}", endpoint)]


async def app(scope: Any, receive: Any, send: Any) -> None:
    scope["route"] = ROUTES[0]  # as Starlette's router leaves it on the scope
    await endpoint(scope, receive, send)


def request(headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/threads/t_1",
        "raw_path": b"/v1/threads/t_1",
        "query_string": b"",
        "headers": headers,
        "scheme": "http",
        "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 5000),
        "http_version": "1.1",
        "root_path": "",
    }


async def call(middleware: tracing.HttpTelemetry, scope: dict[str, Any]) -> list[Any]:
    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        sent.append(message)

    await middleware(scope, receive, send)
    return sent


@pytest.fixture
def metrics(monkeypatch: pytest.MonkeyPatch) -> tuple[Recorder, Recorder]:
    seen.clear()
    seen_baggage.clear()
    counter, histogram = Recorder(), Recorder()
    monkeypatch.setattr(tracing, "HTTP_REQUESTS", counter)
    monkeypatch.setattr(tracing, "HTTP_DURATION", histogram)
    return counter, histogram


def test_with_tracing_off_the_callers_trace_is_current_and_no_span_is_made(
    monkeypatch: pytest.MonkeyPatch, metrics: tuple[Recorder, Recorder]
) -> None:
    monkeypatch.setattr(tracing, "tracing_on", lambda: False)
    middleware = tracing.HttpTelemetry(app, ROUTES)

    async def instrumented(*_: Any) -> None:
        raise AssertionError("the instrumentation ran with tracing off")

    middleware.traced = instrumented  # type: ignore[assignment]
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    traceparent = f"00-{trace_id}-{parent_id}-01"
    headers = [(b"traceparent", traceparent.encode()), (b"baggage", b"tenant=acme")]
    sent = asyncio.run(call(middleware, request(headers)))

    assert sent[0]["status"] == 201
    [(span, propagated)] = seen
    assert format(span.trace_id, "032x") == trace_id
    assert format(span.span_id, "016x") == parent_id
    assert propagated == traceparent  # what a run enqueued by this request stores
    assert seen_baggage == ["acme"]
    assert trace.get_current_span() is trace.INVALID_SPAN  # detached after the request

    counter, histogram = metrics
    attributes = {"http.method": "POST", "http.route": "/v1/threads/{thread_id}"}
    assert counter.calls == [(1, {**attributes, "http.status_code": 201})]
    [(seconds, recorded)] = histogram.calls
    assert recorded == {**attributes, "http.status_code": 201} and seconds >= 0


def test_without_a_traceparent_nothing_is_current(
    monkeypatch: pytest.MonkeyPatch, metrics: tuple[Recorder, Recorder]
) -> None:
    monkeypatch.setattr(tracing, "tracing_on", lambda: False)
    asyncio.run(call(tracing.HttpTelemetry(app, ROUTES), request([])))
    [(span, propagated)] = seen
    assert not span.is_valid and propagated is None


def test_with_tracing_on_the_instrumentation_makes_the_span(
    monkeypatch: pytest.MonkeyPatch, metrics: tuple[Recorder, Recorder]
) -> None:
    monkeypatch.setattr(tracing, "tracing_on", lambda: True)
    middleware = tracing.HttpTelemetry(app, ROUTES)
    calls: list[str] = []
    traced = middleware.traced

    async def instrumented(scope: Any, receive: Any, send: Any) -> None:
        calls.append(scope["path"])
        await traced(scope, receive, send)

    middleware.traced = instrumented  # type: ignore[assignment]
    asyncio.run(call(middleware, request([])))
    assert calls == ["/v1/threads/t_1"]
    assert [status for _, a in metrics[0].calls for status in [a["http.status_code"]]] == [201]


def test_a_failing_app_is_counted_as_a_500(
    monkeypatch: pytest.MonkeyPatch, metrics: tuple[Recorder, Recorder]
) -> None:
    monkeypatch.setattr(tracing, "tracing_on", lambda: False)

    async def failing(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        asyncio.run(call(tracing.HttpTelemetry(failing, ROUTES), request([])))
    [(_, attributes)] = metrics[0].calls
    assert attributes == {"http.method": "POST", "http.route": "unmatched", "http.status_code": 500}


def test_tracing_on_follows_the_global_provider() -> None:
    provider = trace.get_tracer_provider()
    expected = not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))
    assert tracing.tracing_on() is expected
