"""uvicorn's websocket protocol with a synchronous send for the fan-out hot path.

Through ASGI, every frame a gateway sends costs a writer-task wake-up and a chain of `send`
coroutines (Starlette, uvicorn) that end in a `transport.write`. This protocol adds one ASGI
scope extension, `SEND_NOW`: a plain function that frames a text message and writes it to the
transport at once, or returns False when it cannot (handshake not done, closing, or the
transport paused because the peer reads slowly). The gateway uses it while nothing is queued
ahead in the connection's outbox and falls back to its writer task otherwise, so order and
backpressure stay as they were. Everything else (handshake, receive, close, pings) is uvicorn's.

Without permessage-deflate the frame is built once per message and the same bytes are written
to every connection (a one-entry cache: the hub hands every listener the very same object).

Idle memory: uvicorn's receive queue (an asyncio.Queue: four deques) and its `writable` Event (a
deque) become the small equivalents below, and the handshake's request and response are
released once the connection is accepted; together a few KiB per open connection.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.protocol import State

# The scope extension's key; its value is a `SendNow`.
SEND_NOW = "threadline.send_now"
SendNow = Callable[[bytes], bool]

_last: tuple[bytes, bytes] = (b"", b"\x81\x00")


def text_frame(data: bytes) -> bytes:
    """An unmasked, unfragmented server text frame carrying `data` (UTF-8)."""
    global _last
    if _last[0] is data:
        return _last[1]
    size = len(data)
    if size < 126:
        head = bytes((0x81, size))
    elif size < 1 << 16:
        head = struct.pack("!BBH", 0x81, 126, size)
    else:
        head = struct.pack("!BBQ", 0x81, 127, size)
    frame = head + data
    _last = (data, frame)
    return frame


T = TypeVar("T")


class Signal:
    """What uvicorn uses of an asyncio.Event (set, clear, is_set, wait), one future at most."""

    __slots__ = ("_set", "_waiter")

    def __init__(self) -> None:
        self._set = False
        self._waiter: asyncio.Future[None] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    async def wait(self) -> bool:
        while not self._set:
            if self._waiter is None or self._waiter.done():
                self._waiter = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._waiter)
        return True


class Inbox(Generic[T]):
    """What uvicorn uses of an unbounded asyncio.Queue (put_nowait, get, empty), one getter."""

    __slots__ = ("_items", "_ready")

    def __init__(self) -> None:
        self._items: list[T] = []
        self._ready = Signal()

    def put_nowait(self, item: T) -> None:
        self._items.append(item)
        self._ready.set()

    def empty(self) -> bool:
        return not self._items

    async def get(self) -> T:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        return self._items.pop(0)


class WebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O websockets protocol plus the `SEND_NOW` scope extension."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue = Inbox()  # type: ignore[assignment]
        self.writable = Signal()  # type: ignore[assignment]
        self.writable.set()

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None:
            scope["extensions"][SEND_NOW] = self.send_now

    async def send(self, message: Any) -> None:
        await super().send(message)
        if message["type"] == "websocket.accept" and self.handshake_complete:
            # Only the handshake reads them; an open connection need not keep the headers.
            self.request = self.response = None  # type: ignore[assignment]

    def send_now(self, data: bytes) -> bool:
        """Write `data` as one text frame now; False if it must wait (or cannot be sent)."""
        if (
            not self.handshake_complete
            or self.close_sent
            or self.disconnected
            or not self.writable.is_set()
            or self.transport.is_closing()
            or self.conn.state is not State.OPEN
        ):
            return False
        if self.conn.extensions:  # permessage-deflate: one compression context each
            self.conn.send_text(data)
            self.transport.write(b"".join(self.conn.data_to_send()))
        else:
            self.transport.write(text_frame(data))
        return True
