"""Websockets against a gateway's connection caps: one accepted, or the close code of a refusal."""

from __future__ import annotations

import asyncio

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests.e2e import harness


async def opened(gateway: harness.ServerHandle, token: str) -> ClientConnection:
    """A websocket the gateway accepted (its first answer came: it is past the cap check)."""
    ws = await connect(f"{gateway.ws_url}?token={token}")
    await ws.send('{"type": "ping"}')
    await ws.recv()
    return ws


async def refused_with(gateway: harness.ServerHandle, token: str) -> int | None:
    """The close code of a connection the gateway refuses (None if it was accepted)."""
    async with connect(f"{gateway.ws_url}?token={token}") as ws:
        try:
            await ws.send('{"type": "ping"}')
            await asyncio.wait_for(ws.recv(), 10)
        except ConnectionClosed as closed:
            return closed.rcvd.code if closed.rcvd else None
    return None
