"""The gateway's view of one accepted websocket: callbacks in, synchronous sends out.

A `Wire` hands every ASGI receive event (`websocket.receive`, `websocket.disconnect`) to a
callback as it arrives, writes a frame at once or refuses it (`send_now`), and calls back when
it can take frames again. With no task parked in `receive()` and none in `send()`, an idle
connection holds no coroutine of its own: that is most of what a subscribed tab costs
(docs/operations.md, "Fan-out").

- `server.transports.ws.uvicorn_ws.WebSocketProtocol` itself, under uvicorn (how `threadline
  serve` runs): the protocol calls the callbacks from its own event handlers, and takes the
  connection over from the ASGI call (`hand_over`), so not even that call's coroutines stay behind.
- `AsgiWire`: any other ASGI server. One task reads `receive()`, and a frame being sent is a
  short-lived task; the same contract, at the cost of those tasks.

Reading is flow controlled like uvicorn's own `receive()`: the transport pauses after a
message, and `resume_reading()` (called once the gateway has handled what it was given)
resumes it, so a client cannot queue unbounded frames ahead of its commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from starlette.websockets import WebSocket, WebSocketState

from server.transports.ws.uvicorn_ws import WIRE

log = logging.getLogger(__name__)

# An ASGI websocket receive event: {"type": "websocket.receive", "text" | "bytes": ...} or
# {"type": "websocket.disconnect", "code": ...}.
Message = Mapping[str, Any]
OnMessage = Callable[[Message], None]
OnWritable = Callable[[], None]


class Wire(Protocol):
    def attach(self, on_message: OnMessage, on_writable: OnWritable) -> None:
        """Deliver receive events to `on_message` from now on (and any already waiting);
        call `on_writable` whenever a refused `send_now` may now succeed."""

    def send_now(self, data: bytes) -> bool:
        """Write `data` (UTF-8) as one text frame now, or return False if it must wait."""

    def resume_reading(self) -> None:
        """The last message was handled: let the next one in."""

    def detach(self) -> None:
        """Stop calling back (the connection is ending)."""

    def hand_over(self) -> bool:
        """Let the ASGI call that accepted the websocket return while it stays open (True), or
        refuse (False: the call must last as long as the connection)."""

    async def close(self, code: int | None, reason: str, grace: float) -> None:
        """Close with `code` (a closing handshake), or with None because the peer left; either
        way the websocket is done once the ASGI call has returned or this was handed over.
        Returns at once or within `grace` seconds, even for a peer that stopped reading; the
        native wire then aborts the socket if it is still open after `grace`."""


async def close_websocket(websocket: WebSocket, code: int, reason: str) -> None:
    """Close an accepted websocket with `code`, unless the peer is already gone."""
    if websocket.application_state is not WebSocketState.DISCONNECTED:
        await websocket.close(code, reason)


def wire_for(websocket: WebSocket) -> Wire:
    """The protocol's own wire where the server offers it, else the task-based fallback."""
    native = websocket.scope.get("extensions", {}).get(WIRE)
    return native if native is not None else AsgiWire(websocket)


class AsgiWire:
    """A `Wire` over plain ASGI `receive`/`send`, for servers without `WebSocketProtocol`."""

    def __init__(self, websocket: WebSocket) -> None:
        self._websocket = websocket
        self._on_message: OnMessage | None = None
        self._on_writable: OnWritable | None = None
        self._reader: asyncio.Task[None] | None = None
        self._sender: asyncio.Task[None] | None = None
        self._reading: asyncio.Future[None] | None = None

    def attach(self, on_message: OnMessage, on_writable: OnWritable) -> None:
        self._on_message, self._on_writable = on_message, on_writable
        self._reader = asyncio.create_task(self._read(), name="ws-read")

    def send_now(self, data: bytes) -> bool:
        if self._on_message is None or (self._sender is not None and not self._sender.done()):
            return False
        self._sender = asyncio.create_task(self._send(data), name="ws-send")
        return True

    def resume_reading(self) -> None:
        if self._reading is not None and not self._reading.done():
            self._reading.set_result(None)

    def detach(self) -> None:
        self._on_message = self._on_writable = None
        for task in (self._reader, self._sender):
            if task is not None:
                task.cancel()

    def hand_over(self) -> bool:
        return False  # receive() and send() belong to the ASGI call

    async def close(self, code: int | None, reason: str, grace: float) -> None:
        if code is not None:  # else the server ends the websocket when the ASGI call returns
            # Plain ASGI offers no abort: a peer that stopped reading holds the send, and it is
            # the server's own timeouts that end the socket once the ASGI call returns.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await close_websocket(self._websocket, code, reason)

    async def _read(self) -> None:
        while self._on_message is not None:
            try:
                message = await self._websocket.receive()
            except Exception as exc:  # the peer went away in a way Starlette reports as an error
                log.debug("websocket receive ended: %r", exc)
                message = {"type": "websocket.disconnect", "code": 1006}
            self._reading = asyncio.get_running_loop().create_future()
            on_message = self._callback()
            if on_message is None:  # detached while receiving
                return
            on_message(message)
            if message["type"] == "websocket.disconnect":
                return
            await self._reading

    def _callback(self) -> OnMessage | None:
        return self._on_message

    async def _send(self, data: bytes) -> None:
        with contextlib.suppress(Exception):  # a failed send shows up as a disconnect
            await self._websocket.send_text(data.decode("utf-8"))
        if self._on_writable is not None:
            self._sender = None
            self._on_writable()
