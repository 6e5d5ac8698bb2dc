"""A real server exports its spans over OTLP: HTTP SERVER spans by the current conventions, the
episode linked to the request's `traceparent` (also when a worker that gets no wakeup takes the
run by its poll), GenAI spans for the model and the tool."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conformance.provider_wire import OpenAIVendor, WireServer
from tests.e2e import harness
from tests.e2e.otlp_receiver import Receiver, Span, otlp_receiver


@pytest.fixture
def model_server() -> Iterator[WireServer]:
    server = WireServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def traced_env(
    tmp_path: Path, model_server: WireServer, receiver: Receiver, **more: str
) -> dict[str, str]:
    """A server on SQLite running the traced agent against `model_server`, exporting its spans
    to `receiver` every 100 ms; `more` adds settings."""
    return harness.server_env(
        harness.sqlite_url(tmp_path),
        {
            "THREADLINE_AGENT": "tests.e2e.traced_agent:agent",
            "TRACED_MODEL_URL": f"{model_server.url}/v1",
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "THREADLINE_DEV_TOKEN": "false",
        }
        | more,
    )


def named(spans: list[Span], name: str) -> list[Span]:
    return [s for s in spans if s.name == name]


def test_request_episode_model_and_tool_spans(tmp_path: Path, model_server: WireServer) -> None:
    vendor = OpenAIVendor()
    model_server.reply(
        vendor.tool_reply([("call_1", "lookup", ['{"city": ', '"Oslo"}'])]),
        vendor.text_reply(["It is ", "sunny."], usage=(12, 4)),
    )
    with otlp_receiver() as receiver:
        env = traced_env(tmp_path, model_server, receiver)
        with harness.start(env=env, log_dir=tmp_path) as server:
            run(server, receiver)
        assert "Traceback" not in server.log(), server.log()[-3000:]


def test_a_worker_that_only_polls_links_the_episode_to_the_request(
    tmp_path: Path, model_server: WireServer
) -> None:
    """A gateway and a worker on one SQLite file and no shared bus: the request's wakeup never
    reaches the worker, its poll takes the run, and the link comes from the stored run."""
    model_server.reply(OpenAIVendor().text_reply(["polled."], usage=(3, 1)))
    with otlp_receiver() as receiver:
        env = traced_env(tmp_path, model_server, receiver, THREADLINE_POLL_INTERVAL="0.2")
        with (
            harness.start("gateway", env, log_dir=tmp_path) as gateway,
            harness.start("worker", env, log_dir=tmp_path) as worker,
        ):
            token = gateway.token("traces")
            trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
            with httpx.Client(
                base_url=gateway.url, headers={"Authorization": f"Bearer {token}"}, timeout=10
            ) as http:
                thread_id = http.post("/v1/threads", json={}).json()["thread"]["id"]
                sent = http.post(
                    f"/v1/threads/{thread_id}/messages",
                    json={"text": "hello"},
                    headers={"traceparent": f"00-{trace_id}-{parent_id}-01"},
                )
                assert sent.status_code == 202, sent.text
                run_id = sent.json()["run_id"]
            spans = receiver.wait_for(
                lambda spans: (
                    any(s.attributes.get("run_id") == run_id for s in spans)
                    and any(s.trace_id == trace_id for s in spans)
                )
            )
        for server in (gateway, worker):
            assert "Traceback" not in server.log(), server.log()[-3000:]
    [request] = [s for s in spans if s.trace_id == trace_id]
    assert request.parent_span_id == parent_id
    [episode] = [
        s for s in named(spans, "threadline.episode") if s.attributes.get("run_id") == run_id
    ]
    assert episode.trace_id != trace_id
    assert [(t, s) for t, s, _ in episode.links] == [(trace_id, request.span_id)]


def run(server: harness.ServerHandle, receiver: Receiver) -> None:
    token = server.token("traces")
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    traceparent = f"00-{trace_id}-{parent_id}-01"
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=10
    ) as http:
        thread_id = http.post("/v1/threads", json={}).json()["thread"]["id"]
        sent = http.post(
            f"/v1/threads/{thread_id}/messages",
            json={"text": "weather in Oslo?"},
            headers={"traceparent": traceparent},
        )
        assert sent.status_code == 202, sent.text
        deadline = time.monotonic() + 20
        while http.get(f"/v1/threads/{thread_id}").json()["run"]["status"] != "completed":
            assert time.monotonic() < deadline, "the run never completed"
            time.sleep(0.05)

    spans = receiver.wait_for(
        lambda spans: (
            bool(named(spans, "threadline.episode"))
            and len(named(spans, "chat gpt-test")) == 2
            and any(s.trace_id == trace_id for s in spans)
        )
    )
    [request] = [s for s in spans if s.trace_id == trace_id]
    assert request.name == "POST /v1/threads/{thread_id}/messages"
    assert request.kind == "SPAN_KIND_SERVER"
    assert request.parent_span_id == parent_id  # the caller's traceparent is the parent
    attributes = request.attributes
    assert attributes["http.request.method"] == "POST"
    assert attributes["http.route"] == "/v1/threads/{thread_id}/messages"
    assert attributes["http.response.status_code"] == 202
    assert attributes["url.path"] == f"/v1/threads/{thread_id}/messages"
    assert "http.method" not in attributes and "http.status_code" not in attributes

    [episode] = named(spans, "threadline.episode")
    assert episode.trace_id != trace_id  # a trace of its own, linked to the request
    assert [(t, s) for t, s, _ in episode.links] == [(trace_id, request.span_id)]

    calls = named(spans, "chat gpt-test")
    for call in calls:
        assert call.kind == "SPAN_KIND_CLIENT"
        assert call.trace_id == episode.trace_id and call.parent_span_id == episode.span_id
        a = call.attributes
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.provider.name"] == "openai"
        assert a["gen_ai.request.model"] == "gpt-test"
        assert a["gen_ai.response.model"] == "gpt-test"
        assert a["gen_ai.response.id"] == "chatcmpl-test"
        assert a["server.address"] == "127.0.0.1"
        assert isinstance(a["server.port"], int)
    reasons = sorted(tuple(c.attributes["gen_ai.response.finish_reasons"]) for c in calls)
    assert reasons == [("stop",), ("tool_calls",)]
    usage = {
        (c.attributes["gen_ai.usage.input_tokens"], c.attributes["gen_ai.usage.output_tokens"])
        for c in calls
    }
    assert (12, 4) in usage

    [tool] = named(spans, "execute_tool lookup")
    assert tool.trace_id == episode.trace_id
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["gen_ai.tool.name"] == "lookup"
    assert tool.attributes["gen_ai.tool.call.id"] == "call_1"
