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
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

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


class WebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O websockets protocol plus the `SEND_NOW` scope extension."""

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None:
            scope["extensions"][SEND_NOW] = self.send_now

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
