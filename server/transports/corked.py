"""A transport whose writes made in one event-loop step reach the socket as one write.

uvicorn writes a response's status line and headers, then its body, each with its own
`transport.write`; on uvloop each is a `write(2)` at once, and on loopback a `write(2)` also
delivers the segment to the peer's socket within the call: two system calls per response where
one would do. A websocket's frames are the same: several chunks handed to a connection in one
step (the hub delivers a batch of bus messages together) are several writes.

`CorkedTransport` holds what is written during the current step and writes it, joined, from a
callback scheduled on the first write (`loop.call_soon`): it goes out before the loop next waits
for I/O, so nothing is delayed past the step that wrote it. Order is kept for everything that
goes through it: `close()` and `write_eof()` write what is held first, `abort()` drops it (as
the transport drops its own buffer). A single write is passed on as the same bytes object.
"""

from __future__ import annotations

import asyncio
from typing import Any


class CorkedTransport(asyncio.Transport):
    """`transport`, with the writes of one loop step joined into one (see the module)."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._held: list[bytes | bytearray | memoryview] = []

    # -- writing ---------------------------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        self._held.append(data)
        if len(self._held) == 1:
            self._loop.call_soon(self.flush)

    def write_now(self, data: bytes) -> None:
        """Write `data` at once, after what is held: for a write that is alone in its step (a
        keepalive ping from its timer), where holding it would only add a callback."""
        self.flush()
        if not self._transport.is_closing():
            self._transport.write(data)

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def flush(self) -> None:
        """Write what is held now (the scheduled callback; also before close and EOF)."""
        held = self._held
        if not held:
            return
        self._held = []
        if self._transport.is_closing():
            return  # the transport would only warn: what it was closed with is all it sends
        self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(len(d) for d in self._held)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    # -- closing ---------------------------------------------------------------------------------

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held.clear()
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    # -- the rest is the transport's -------------------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()
