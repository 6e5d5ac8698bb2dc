"""SIGTERM drains a gateway: AG-UI and AI SDK streams get their final error event, a websocket
close code 1012, within the grace; nothing is cancelled with a traceback; the runs finish on
another worker."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from runtime.service.client_threads import client_thread_id
from tests.e2e import cluster
from tests.services import require_postgres, require_redis

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

GRACE = 5.0
# 200 demo chunks of 80 ms: a reply streams for about 16 s, long enough to start a second
# process and stop the first one mid-run.
SLOW = {"THREADLINE_DEMO_DELAY_MS": "80", "THREADLINE_LEASE_TTL": "2"}
LONG_TEXT = "drain " * 170
EXIT_TIMEOUT = GRACE + 20  # a hang guard: the process must exit well inside it


class Stream:
    """One SSE response read line by line in a task, with when its last event came."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.started = asyncio.Event()
        self.ended_at: float | None = None

    async def read(self, client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> None:
        async with client.stream("POST", path, json=body) as response:
            assert response.status_code == 200, await response.aread()
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    self.events.append(line.removeprefix("data: "))
                    if "delta" in line.lower():
                        self.started.set()
        self.ended_at = time.monotonic()


def agui_body(thread_id: str) -> dict[str, Any]:
    message = {"id": f"m-{uuid.uuid4().hex}", "role": "user", "content": LONG_TEXT}
    return {"threadId": thread_id, "runId": f"r-{uuid.uuid4().hex}", "messages": [message]}


def aisdk_body(chat_id: str) -> dict[str, Any]:
    message = {
        "id": f"m-{uuid.uuid4().hex}",
        "role": "user",
        "parts": [{"type": "text", "text": LONG_TEXT}],
    }
    return {"id": chat_id, "messages": [message], "trigger": "submit-message"}


@pytest.fixture
def running() -> Iterator[cluster.Cluster]:
    require_postgres()
    require_redis()
    extra = {**SLOW, "THREADLINE_SHUTDOWN_GRACE": str(GRACE), "THREADLINE_LOG_LEVEL": "info"}
    with cluster.cluster(["all"], extra=extra) as started:
        yield started


async def test_sigterm_drains_streams_and_the_runs_finish_elsewhere(
    running: cluster.Cluster,
) -> None:
    (first,) = running.processes
    token = running.tokens({"alice": ("drain", "user", "alice")})["alice"]
    headers = {"Authorization": f"Bearer {token}"}
    agui_thread, chat_id = f"agui-{uuid.uuid4().hex}", f"chat-{uuid.uuid4().hex}"
    agui, aisdk = Stream(), Stream()
    async with (
        httpx.AsyncClient(base_url=first.url, headers=headers, timeout=60) as client,
        connect(first.ws_url, additional_headers=headers) as websocket,
    ):
        readers = [
            asyncio.create_task(agui.read(client, "/v1/ag-ui", agui_body(agui_thread))),
            asyncio.create_task(aisdk.read(client, "/v1/ai-sdk/chat", aisdk_body(chat_id))),
        ]
        async with asyncio.timeout(30):
            await agui.started.wait()
            await aisdk.started.wait()
        # Another process that can take the runs over; started now, so the first one
        # is the one running them.
        await asyncio.to_thread(running.start, ["all"], {"THREADLINE_LOG_FORMAT": "json"})
        second = running.processes[1]
        assert not agui.ended_at and not aisdk.ended_at, "the runs ended before SIGTERM"

        first.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        with pytest.raises(ConnectionClosed) as closed:
            async with asyncio.timeout(GRACE + 5):
                while True:
                    await websocket.recv()
        async with asyncio.timeout(GRACE + 5):
            await asyncio.gather(*readers)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012

    # Each stream ended with its protocol's final event, inside the grace.
    for stream in (agui, aisdk):
        assert stream.ended_at is not None and stream.ended_at - signalled < GRACE
    final = json.loads(agui.events[-1])
    assert final["type"] == "RUN_ERROR" and final["code"] == "unavailable"
    assert aisdk.events[-1] == "[DONE]"
    error = json.loads(aisdk.events[-2])
    assert error["type"] == "error" and "shutting down" in error["errorText"]

    await asyncio.to_thread(first.process.wait, EXIT_TIMEOUT)
    log = first.log()
    assert "Traceback" not in log and "CancelledError" not in log, log[-4000:]
    assert "timeout graceful shutdown exceeded" not in log

    # The runs go on: the second process takes them over and completes them.
    async with httpx.AsyncClient(base_url=second.url, headers=headers, timeout=10) as http:
        # Client-chosen ids live in the caller's scope (runtime/service/client_threads.py).
        stored = [client_thread_id("drain", client_id) for client_id in (agui_thread, chat_id)]
        runs = [await completed_run(http, thread_id) for thread_id in stored]
    events = [json.loads(line) for line in second.log().splitlines() if line.startswith("{")]
    finished = {e.get("run_id") for e in events if e["message"] == "episode ended: completed"}
    assert {run["id"] for run in runs} <= finished


async def completed_run(http: httpx.AsyncClient, thread_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    run: dict[str, Any] = {}
    while time.monotonic() < deadline:
        run = (await http.get(f"/v1/threads/{thread_id}")).json()["run"]
        if run["status"] == "completed":
            return run
        await asyncio.sleep(0.2)
    raise AssertionError(f"the run of {thread_id} never completed: {run}")
