"""The gateway's two wires (server/transports/ws/wire.py) under a real uvicorn, in this process.

`threadline serve` runs uvicorn with `server.transports.ws.uvicorn_ws.WebSocketProtocol`, whose
wire calls the gateway back; any other ASGI server gets `AsgiWire` (tasks over
`receive`/`send`). Both must carry the same protocol: commands answered in the order sent even
when pipelined, a stream in order, a close code for an oversize frame, every way a connection
ends releasing what it held.
With the protocol's wire the ASGI call returns once the connection is set up (`hand_over`), so
an idle subscribed connection holds no task at all.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from starlette.applications import Starlette
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from server.app import create_app
from server.auth import token_key
from server.settings import Settings
from server.transports.ws.gateway import Gateway
from server.transports.ws.uvicorn_ws import WebSocketProtocol
from tests.e2e import harness

TIMEOUT = 10.0
WIRES: dict[str, type[asyncio.Protocol] | str] = {
    "protocol": WebSocketProtocol,
    "asgi": "websockets-sansio",
}


class Served:
    def __init__(self, server: uvicorn.Server, port: int, token: str, app: Starlette) -> None:
        self.server, self.port, self.token, self.app = server, port, token, app

    @property
    def gateway(self) -> Gateway:
        return self.app.state.gateway  # type: ignore[no-any-return]

    async def released(self) -> None:
        """Until the gateway holds no connection (bounded)."""
        for _ in range(int(TIMEOUT / 0.02)):
            if not (self.gateway.connection_count or self.gateway._ending):
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"{self.gateway.connection_count} connections still held")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def connect(self) -> ClientConnection:
        return await connect(
            f"ws://127.0.0.1:{self.port}/v1/ws?token={self.token}",
            open_timeout=TIMEOUT,
            close_timeout=2,
            max_size=2**22,
        )

    async def new_thread(self) -> str:
        async with httpx.AsyncClient(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=TIMEOUT
        ) as http:
            response = await http.post("/v1/threads", json={})
            return str(response.json()["thread"]["id"])


@pytest.fixture(params=list(WIRES))
async def served(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Served]:
    env = harness.server_env(harness.sqlite_url(tmp_path))
    token = harness.create_token(env, "wire", "user", "wire")
    settings = Settings(
        database_url=env["THREADLINE_DATABASE_URL"], demo_delay_ms=0, ws_max_frame_bytes=4096
    )
    port = harness.free_port()
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        ws=WIRES[request.param],
        log_level="warning",
        lifespan="on",
        ws_per_message_deflate=False,
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    try:
        for _ in range(int(TIMEOUT / 0.02)):  # uvicorn sets a flag, it has no event
            if server.started or serving.done():
                break
            await asyncio.sleep(0.02)
        assert server.started, "uvicorn did not start"
        yield Served(server, port, token, app)
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            async with asyncio.timeout(TIMEOUT):
                await serving


async def frames_until(ws: ClientConnection, done: Any) -> list[dict[str, Any]]:
    frames = []
    async with asyncio.timeout(TIMEOUT):
        while True:
            frames.append(dict(orjson.loads(await ws.recv())))
            if done(frames[-1]):
                return frames


async def test_pipelined_commands_are_answered_in_order_and_a_run_streams(
    served: Served,
) -> None:
    thread_id = await served.new_thread()
    async with await served.connect() as ws:
        # Sent back to back before any answer: fed one at a time, answered in order.
        await ws.send(orjson.dumps({"type": "subscribe", "thread_id": thread_id, "id": 0}))
        for index in range(1, 6):
            await ws.send(orjson.dumps({"type": "ping", "id": index}))
        await ws.send(
            orjson.dumps(
                {"type": "message.send", "thread_id": thread_id, "text": "hello wire", "id": 6}
            )
        )
        frames = await frames_until(
            ws, lambda f: f["type"] == "chunk" and f["chunk"]["type"] == "step-finish"
        )
    answers = [f["id"] for f in frames if "id" in f]
    assert answers == list(range(7)), frames
    chunks = [f for f in frames if f["type"] == "chunk"]
    assert [f["seq"] for f in chunks] == list(range(len(chunks)))
    text = "".join(f["chunk"].get("delta", "") for f in chunks)
    assert "hello wire" in text


async def test_an_oversize_frame_closes_1009_and_the_gateway_keeps_serving(
    served: Served,
) -> None:
    async with await served.connect() as ws:
        await ws.send("x" * 5000)
        with pytest.raises(ConnectionClosed) as closed:
            async with asyncio.timeout(TIMEOUT):
                while True:
                    await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    thread_id = await served.new_thread()
    async with await served.connect() as ws:
        await ws.send(orjson.dumps({"type": "subscribe", "thread_id": thread_id, "id": 1}))
        assert (await frames_until(ws, lambda f: f.get("id") == 1))[-1]["type"] == "subscribed"


def client_side(task: asyncio.Task[Any]) -> bool:
    code = getattr(task.get_coro(), "cr_code", None)
    return code is not None and "/websockets/asyncio/" in code.co_filename


@pytest.mark.parametrize("served", ["protocol"], indirect=True)
async def test_an_idle_subscribed_connection_holds_no_task_of_its_own(served: Served) -> None:
    thread_id = await served.new_thread()
    # The first subscriber starts what the gateway keeps one of (per process or per thread:
    # token and slot keepers, the thread's presence room); the next 20 add only themselves.
    sockets = [await served.connect()]
    await sockets[0].send(orjson.dumps({"type": "subscribe", "thread_id": thread_id, "id": 0}))
    await frames_until(sockets[0], lambda f: f.get("id") == 0)
    await asyncio.sleep(0.3)
    before = asyncio.all_tasks()
    sockets += [await served.connect() for _ in range(20)]
    try:
        for index, ws in enumerate(sockets[1:], start=1):
            await ws.send(orjson.dumps({"type": "subscribe", "thread_id": thread_id, "id": index}))
            await frames_until(ws, lambda f, index=index: f.get("id") == index)
        await asyncio.sleep(0.3)  # presence rereads and the like finish
        # Not even uvicorn's ASGI call: it returned once the connection was handed over.
        # (The clients' tasks are not the server's.)
        added = [t for t in asyncio.all_tasks() - before if not client_side(t)]
        assert added == [], sorted(repr(t.get_coro()) for t in added)
        assert served.gateway.connection_count == 21
    finally:
        for ws in sockets:
            await ws.close()
    await served.released()


async def test_every_way_a_connection_ends_releases_it(served: Served) -> None:
    """The peer leaving, the server closing with a code, and shutdown: each closes the
    websocket with its code and leaves the gateway holding nothing of it."""
    thread_id = await served.new_thread()
    subscribe = orjson.dumps({"type": "subscribe", "thread_id": thread_id, "id": 1})
    async with await served.connect() as ws:
        await ws.send(subscribe)
        await frames_until(ws, lambda f: f.get("id") == 1)
    await served.released()

    ws = await served.connect()
    await ws.send(subscribe)
    await frames_until(ws, lambda f: f.get("id") == 1)
    assert await served.gateway.revoke(token_key(served.token)) == 1
    async with asyncio.timeout(TIMEOUT):
        await ws.wait_closed()
    assert ws.close_code == 4403, ws.close_code
    await served.released()

    ws = await served.connect()
    await ws.send(subscribe)
    await frames_until(ws, lambda f: f.get("id") == 1)
    served.server.should_exit = True
    async with asyncio.timeout(TIMEOUT):
        await ws.wait_closed()
    assert ws.close_code in (1001, 1012), ws.close_code
    await served.released()
