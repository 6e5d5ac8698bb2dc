"""Keepalive of the gateway's websocket protocol (server/transports/ws/uvicorn_ws.py) under a
real uvicorn, in this process: with the pong deadline equal to the ping interval (the default),
the loop's keepalive wheel pings a peer that answers for as long as it stays, drops one that
stops answering with 1011 one interval after the ping it missed, and serves connections that
opened together with one timer, which a closed connection leaves."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import struct
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import uvicorn
from websockets.asyncio.client import connect

from server.transports.ws import keepalive
from server.transports.ws.uvicorn_ws import WebSocketProtocol
from tests.e2e import harness

INTERVAL = 0.3  # ws_ping_interval and ws_ping_timeout
TIMEOUT = 10.0


async def app(scope: Any, receive: Any, send: Any) -> None:
    """Accept a websocket and hold it until the peer leaves."""
    if scope["type"] != "websocket":
        return
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    while (await receive())["type"] != "websocket.disconnect":
        pass


@contextlib.asynccontextmanager
async def serving(interval: float) -> AsyncIterator[int]:
    """uvicorn with the gateway's websocket protocol on a free port, in this process."""
    free = harness.free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=free,
        ws=WebSocketProtocol,
        ws_ping_interval=interval,
        ws_ping_timeout=interval,
        log_level="warning",
        lifespan="off",
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(int(TIMEOUT / 0.02)):  # uvicorn sets a flag, it has no event
            if server.started or task.done():
                break
            await asyncio.sleep(0.02)
        assert server.started, "uvicorn did not start"
        yield free
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            async with asyncio.timeout(TIMEOUT):
                await task


@pytest.fixture
async def port() -> AsyncIterator[int]:
    async with serving(INTERVAL) as free:
        yield free


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(int(TIMEOUT / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not reached in time")


async def silent_peer(port: int) -> tuple[list[int], float]:
    """A websocket client that never answers a ping: the opcodes it was sent until the server
    hung up (a close frame's code as 0x8000 + code), and how long after the first ping."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        (
            f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    received: list[int] = []
    first_ping = 0.0
    try:
        async with asyncio.timeout(TIMEOUT):
            assert b" 101 " in await reader.readuntil(b"\r\n\r\n")
            while head := await reader.read(2):
                opcode, size = head[0] & 0x0F, head[1] & 0x7F
                payload = await reader.readexactly(size)
                if opcode == 0x9 and not first_ping:
                    first_ping = time.monotonic()
                if opcode == 0x8:
                    received.append(0x8000 + struct.unpack("!H", payload[:2])[0])
                else:
                    received.append(opcode)
    finally:
        writer.close()
    return received, time.monotonic() - first_ping


async def test_a_peer_that_stops_answering_pings_is_dropped_with_1011(port: int) -> None:
    received, after_first_ping = await silent_peer(port)
    assert received == [0x9, 0x8000 + 1011], received  # one ping, then the close
    # Dropped one interval after the ping it left unanswered (a loaded box: some slack).
    assert INTERVAL * 0.9 <= after_first_ping <= INTERVAL + 2.0, after_first_ping


async def test_a_peer_that_answers_pings_stays(port: int) -> None:
    async with connect(f"ws://127.0.0.1:{port}/", ping_interval=None) as ws:
        await asyncio.sleep(INTERVAL * 6)  # websockets answers every ping on its own
        assert ws.protocol.state.name == "OPEN"
        # The connection is still served: a ping of our own is answered.
        async with asyncio.timeout(TIMEOUT):
            await (await ws.ping())


async def test_connections_share_the_wheels_timers_and_leave_them_when_closed() -> None:
    ticks = keepalive.wheel(asyncio.get_running_loop())  # uvicorn runs on this very loop
    # An interval no test outlives: only closing can take a connection off the wheel.
    async with serving(3600.0) as port, contextlib.AsyncExitStack() as stack:
        sockets = [
            await stack.enter_async_context(connect(f"ws://127.0.0.1:{port}/", ping_interval=None))
            for _ in range(20)
        ]
        assert len(ticks) == 20
        assert ticks.timers() <= 2, ticks.timers()  # opened within a second or two of it
        for ws in sockets[:10]:
            await ws.close()
        await until(lambda: len(ticks) == 10)  # the server saw the closes
        assert all(ws.protocol.state.name == "OPEN" for ws in sockets[10:])
    await until(lambda: len(ticks) == 0)
    assert ticks.timers() == 0
