"""Event streams hold connection slots from the websockets' budget (docs/operations.md,
"Connection caps for streams"), on the in-process and the Redis counters: over a cap the next
stream answers `429 too_many_connections` and changes nothing; closing one frees its slot."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import httpx
import pytest

from realtime.closecodes import CloseCode
from tests.e2e import cluster, harness
from tests.e2e.capped_sockets import opened, refused_with
from tests.e2e.jsclients import long_text
from tests.services import require_postgres, unique_prefix

PER_TOKEN = 2
PER_SUBJECT = 3
ENV = {
    "THREADLINE_WS_MAX_CONNECTIONS_PER_TOKEN": str(PER_TOKEN),
    "THREADLINE_WS_MAX_CONNECTIONS_PER_SUBJECT": str(PER_SUBJECT),
    # A run that streams for minutes: the streams following it stay open for the whole test.
    "THREADLINE_DEMO_DELAY_MS": "100",
    "THREADLINE_TOKEN_BURST": "1000",
}
SCOPE = "stream-caps"


@pytest.fixture(
    scope="module",
    params=["memory", pytest.param("redis", marks=[pytest.mark.postgres, pytest.mark.redis])],
)
def gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[harness.ServerHandle]:
    if request.param == "memory":
        database = harness.sqlite_url(tmp_path_factory.mktemp("stream-caps"))
        with harness.start("all", harness.server_env(database, ENV)) as server:
            yield server
        return
    require_postgres()
    with cluster.cluster(["all"], extra={**ENV, "THREADLINE_REDIS_PREFIX": unique_prefix()}) as c:
        yield c.gateways[0]


@pytest.fixture(scope="module")
def running(gateway: harness.ServerHandle) -> Iterator[str]:
    """A thread whose run streams for minutes: its id. The run is stopped at the end."""
    token = gateway.token(SCOPE, "user", "starter")
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=gateway.url, headers=headers, timeout=20.0) as http:
        thread_id = str(http.post("/v1/threads", json={}).json()["thread"]["id"])
        sent = http.post(f"/v1/threads/{thread_id}/messages", json={"text": long_text(3000)})
        assert sent.status_code == 202, sent.text
        yield thread_id
        run_id = sent.json()["run_id"]
        http.post(f"/v1/threads/{thread_id}/runs/{run_id}/stop")


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@asynccontextmanager
async def stream(
    http: httpx.AsyncClient, token: str, thread_id: str
) -> AsyncIterator[httpx.Response]:
    """The AI SDK stream of the run in flight, open (past its slot check) until the block ends."""
    path = f"/v1/ai-sdk/chat/{thread_id}/stream"
    async with http.stream("GET", path, headers=auth(token)) as response:
        yield response


async def hold(stack: AsyncExitStack, http: httpx.AsyncClient, token: str, thread_id: str) -> Any:
    response = await stack.enter_async_context(stream(http, token, thread_id))
    assert response.status_code == 200, await response.aread()
    return response


async def refused(http: httpx.AsyncClient, token: str, thread_id: str) -> None:
    """The next stream of `token` is refused on a cap, with the error body."""
    async with stream(http, token, thread_id) as response:
        body = await response.aread()
        assert response.status_code == 429, body
        error = response.json()["error"]
        assert error["code"] == "too_many_connections", error
        assert "event streams" in error["message"]
        assert response.headers["retry-after"]


async def snapshot(http: httpx.AsyncClient, token: str, thread_id: str) -> Any:
    response = await http.get(f"/v1/threads/{thread_id}", headers=auth(token))
    assert response.status_code == 200, response.text
    return {k: v for k, v in response.json().items() if k != "thread"} | {
        "messages": [m["id"] for m in response.json()["messages"]],
        "queue": response.json()["queue"],
    }


async def eventually_open(
    stack: AsyncExitStack, http: httpx.AsyncClient, token: str, thread_id: str
) -> None:
    """A slot freed by a closed stream is free once the gateway saw the client go (it ends the
    response and leaves the set): bounded attempts, each a refusal until then."""
    for _ in range(50):
        response = await stack.enter_async_context(stream(http, token, thread_id))
        if response.status_code == 200:
            return
        assert response.status_code == 429, await response.aread()
        await response.aclose()
        await asyncio.sleep(0.1)
    raise AssertionError("the closed stream's slot was never freed")


def agui_message(thread_id: str) -> dict[str, Any]:
    message = {"id": uuid.uuid4().hex, "role": "user", "content": "more"}
    return {"threadId": thread_id, "runId": "r", "messages": [message]}


async def test_streams_fill_the_token_cap_and_a_closed_one_frees_its_slot(
    gateway: harness.ServerHandle, running: str
) -> None:
    token = gateway.token(SCOPE, "user", f"streamer-{uuid.uuid4().hex[:6]}")
    async with (
        httpx.AsyncClient(base_url=gateway.url, timeout=30.0) as http,
        AsyncExitStack() as kept,
    ):
        first = AsyncExitStack()
        await hold(first, http, token, running)
        for _ in range(PER_TOKEN - 1):
            await hold(kept, http, token, running)
        await refused(http, token, running)
        # An AG-UI request that would queue a message is refused whole: nothing queued.
        before = await snapshot(http, token, running)
        answer = await http.post("/v1/ag-ui", json=agui_message(running), headers=auth(token))
        assert answer.status_code == 429, answer.text
        assert answer.json()["error"]["code"] == "too_many_connections"
        assert await snapshot(http, token, running) == before
        # A websocket of the same token draws from the same budget.
        assert await refused_with(gateway, token) == CloseCode.TOO_MANY_CONNECTIONS
        await first.aclose()
        await eventually_open(kept, http, token, running)
        await refused(http, token, running)  # full again, with the new one


async def test_websockets_and_streams_share_the_subject_cap(
    gateway: harness.ServerHandle, running: str
) -> None:
    subject = f"shared-{uuid.uuid4().hex[:6]}"
    one, two = (gateway.token(SCOPE, "user", subject) for _ in range(2))
    async with (
        httpx.AsyncClient(base_url=gateway.url, timeout=30.0) as http,
        AsyncExitStack() as kept,
    ):
        ws = await opened(gateway, one)
        kept.push_async_callback(ws.close)
        await hold(kept, http, one, running)
        # Token one: a websocket and a stream fill its cap.
        await refused(http, one, running)
        await hold(kept, http, two, running)
        # The subject holds PER_SUBJECT connections over both tokens: token two is refused
        # on the subject cap though its own holds only one, by stream and by websocket.
        await refused(http, two, running)
        assert await refused_with(gateway, two) == CloseCode.TOO_MANY_CONNECTIONS
        before = await snapshot(http, two, running)
        said = {"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": "hi"}]}
        chat = {"id": running, "trigger": "submit-message", "messages": [said]}
        answer = await http.post("/v1/ai-sdk/chat", json=chat, headers=auth(two))
        assert answer.status_code == 429, answer.text
        assert await snapshot(http, two, running) == before
        await ws.close()
        await eventually_open(kept, http, two, running)
