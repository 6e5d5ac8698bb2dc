"""THREADLINE_LOG_FORMAT=json: every line of a real server's log is one JSON event with its ids."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import httpx
from websockets.sync.client import connect

from tests.e2e import harness
from tests.e2e.otlp_receiver import otlp_receiver


def test_json_log_lines_parse_carry_the_ids_and_never_a_token(tmp_path: Path) -> None:
    env = harness.server_env(
        harness.sqlite_url(tmp_path),
        {
            "THREADLINE_LOG_FORMAT": "json",
            "THREADLINE_LOG_LEVEL": "info",
            "THREADLINE_DEV_TOKEN": "false",
        },
    )
    server = harness.start(env=env, log_dir=tmp_path)
    try:
        token = server.token("logs")
        headers = {"Authorization": f"Bearer {token}", "X-Request-ID": "req-from-the-client"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=10) as http:
            created = http.post("/v1/threads", json={})
            assert created.headers["x-request-id"] == "req-from-the-client"
            thread_id = created.json()["thread"]["id"]
            sent = http.post(f"/v1/threads/{thread_id}/messages", json={"text": "hello"})
            run_id = sent.json()["run_id"]
            # A token in a query string must reach no log line (uvicorn logs request lines).
            http.get(f"/v1/threads/{thread_id}", params={"token": token})
        with connect(f"{server.ws_url}?token={token}"):
            pass
        harness_wait_run(server.url, token, thread_id)
    finally:
        server.stop()
    text = server.log()
    assert token not in text
    events = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert events, text
    for event in events:
        assert {"time", "level", "logger", "message"} <= set(event), event
    access = [e for e in events if e["logger"] == "uvicorn.access"]
    mine = [e for e in access if e.get("request_id") == "req-from-the-client"]
    assert len(mine) == 3, access  # create, send, snapshot (the websocket sent no id)
    assert all(e.get("thread_id") == thread_id for e in mine if "/messages" in e["message"])
    assert all("request_id" in e for e in access)
    ended = [e for e in events if e["message"].startswith("episode ended")]
    assert [(e["run_id"], e["thread_id"]) for e in ended] == [(run_id, thread_id)]
    assert ended[0]["message"] == "episode ended: completed"
    assert {"uvicorn.error", "server.app"} <= {e["logger"] for e in events}


def test_with_tracing_on_the_lines_carry_the_trace_ids(tmp_path: Path) -> None:
    """The request's access line carries the trace of the caller's `traceparent`, and the
    episode's line the episode's own trace and span (as the OTLP receiver got them)."""
    with otlp_receiver() as receiver:
        env = harness.server_env(
            harness.sqlite_url(tmp_path),
            {
                "THREADLINE_LOG_FORMAT": "json",
                "THREADLINE_LOG_LEVEL": "info",
                "THREADLINE_DEV_TOKEN": "false",
                "OTEL_TRACES_EXPORTER": "otlp",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
                "OTEL_BSP_SCHEDULE_DELAY": "100",
            },
        )
        trace_id = secrets.token_hex(16)
        with harness.start(env=env, log_dir=tmp_path) as server:
            token = server.token("logs")
            with httpx.Client(
                base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=10
            ) as http:
                thread_id = http.post("/v1/threads", json={}).json()["thread"]["id"]
                sent = http.post(
                    f"/v1/threads/{thread_id}/messages",
                    json={"text": "hello"},
                    headers={"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"},
                )
                run_id = sent.json()["run_id"]
            harness_wait_run(server.url, token, thread_id)
            spans = receiver.wait_for(
                lambda spans: any(
                    s.name == "threadline.episode" and s.attributes.get("run_id") == run_id
                    for s in spans
                )
            )
    [episode] = [s for s in spans if s.name == "threadline.episode"]
    events = [json.loads(line) for line in server.log().splitlines() if line.strip()]
    [access] = [
        e for e in events if "/messages" in e["message"] and e["logger"] == "uvicorn.access"
    ]
    assert access["trace_id"] == trace_id
    [ended] = [e for e in events if e["message"].startswith("episode ended")]
    assert (ended["trace_id"], ended["span_id"]) == (episode.trace_id, episode.span_id)
    assert (ended["run_id"], ended["thread_id"]) == (run_id, thread_id)


def harness_wait_run(url: str, token: str, thread_id: str) -> None:
    import time

    deadline = time.monotonic() + 20
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as http:
        while time.monotonic() < deadline:
            run = http.get(f"/v1/threads/{thread_id}").json()["run"]
            if run and run["status"] == "completed":
                return
            time.sleep(0.05)
    raise AssertionError("the run never completed")
