"""uvicorn's websocket protocol, driven by callbacks once the gateway has accepted it.

Through ASGI, every frame a gateway sends costs a writer-task wake-up and a chain of `send`
coroutines (Starlette, uvicorn) that end in a `transport.write`, and every open connection keeps
a task parked in `receive()`. This protocol adds one ASGI scope extension, `WIRE`: the protocol
itself, as a `server.transports.ws.wire.Wire`. After `attach()` it hands receive events to the
gateway's callback as they are parsed (no task waits for them), `send_now()` frames a text
message and writes it to the transport at once or returns False when it cannot (handshake not done,
closing, or the transport paused because the peer reads slowly), and `resume_writing` calls the
gateway back to drain what it queued meanwhile, so order and backpressure stay as they were.
`hand_over()` lets the ASGI call return while the websocket stays open (`run_asgi` then leaves
the transport open and drops the scope), and `close()` ends it later. Everything else
(handshake, pings, the accept and close sends) is uvicorn's.

Without permessage-deflate the frame is built once per message and the same bytes are written
to every connection (a one-entry cache: the hub hands every listener the very same object).

Keepalive: when the pong deadline equals the ping interval (the default, 20 s each), a
connection keeps no timer of its own: it waits in the loop's keepalive wheel
(`server.transports.ws.keepalive`), where one timer per tick serves every connection due in it.
Each tick either finds a connection's previous ping unanswered (the peer missed its deadline:
the connection fails with 1011, as uvicorn's) or writes its next ping frame, built here rather
than through the websockets protocol object. So an idle connection's ping costs a share of one
loop wake-up, four random bytes and a write (straight to the socket:
`CorkedTransport.write_now`, no end-of-step callback). Otherwise uvicorn's.

Idle memory: uvicorn's receive queue (an asyncio.Queue: four deques) and its `writable` Event (a
deque) become the small equivalents below, and the handshake's request and response are
released once the connection is accepted; together a few KiB per open connection. And every
attribute of a connection is a slot (`_SLOTS`): uvicorn's protocol sets 37, more than a
CPython instance dictionary shares its keys for (30), so each connection held a dictionary of
its own (about 1.2 KiB); slots are 8 bytes each, and no dictionary is made.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import InvalidState
from websockets.protocol import State

from server.transports.ws import keepalive

# The scope extension's key; its value is the protocol (a `server.transports.ws.wire.Wire`).
WIRE = "threadline.wire"
# SO_LINGER on, 0 s: close() resets the connection and frees the kernel's buffers at once,
# instead of leaving an orphaned socket trying to deliver to a peer that does not read.
_LINGER_RESET = struct.pack("ii", 1, 0)

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
    """What uvicorn uses of an unbounded asyncio.Queue (put_nowait, get, empty), one getter;
    or, once `forward_to` was called, a pipe that hands every item to a callback instead."""

    __slots__ = ("_forward", "_items", "_ready")

    def __init__(self) -> None:
        self._items: list[T] = []
        self._ready = Signal()
        self._forward: Callable[[T], None] | None = None

    def put_nowait(self, item: T) -> None:
        if self._forward is not None:
            self._forward(item)
            return
        self._items.append(item)
        self._ready.set()

    def forward_to(self, forward: Callable[[T], None] | None) -> None:
        """Hand items to `forward` from now on, starting with those already queued; None
        queues them again."""
        self._forward = forward
        while forward is not None and self._items and self._forward is forward:
            forward(self._items.pop(0))

    def empty(self) -> bool:
        return not self._items

    async def get(self) -> T:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        return self._items.pop(0)


# uvicorn 0.3x's WebSocketsSansIOProtocol sets these on every connection (its base class keeps
# a `__dict__`, so an attribute a later uvicorn adds still works, in a dictionary again:
# tests/unit/test_ws_protocol_slots.py notices).
_UVICORN_ATTRIBUTES = (
    "app",
    "app_state",
    "asgi_version",
    "client",
    "close_sent",
    "close_timeout",
    "close_timer",
    "config",
    "conn",
    "connections",
    "curr_msg_data_type",
    "default_headers",
    "disconnected",
    "frames",
    "handshake_complete",
    "handshake_initiated",
    "initial_response",
    "last_ping_rtt",
    "logger",
    "loop",
    "pending_ping_payload",
    "ping_interval",
    "ping_sent_at",
    "ping_timeout",
    "ping_timer",
    "pong_timer",
    "queue",
    "read_paused",
    "request",
    "response",
    "root_path",
    "scheme",
    "scope",
    "server",
    "tasks",
    "transport",
    "writable",
)
_SLOTS = (*_UVICORN_ATTRIBUTES, "_on_writable", "_handed_over", "_abort_timer", "_ping_tick")


class WebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O websockets protocol plus the `WIRE` scope extension."""

    __slots__ = _SLOTS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue: Inbox[Any] = Inbox()  # type: ignore[assignment]
        self.writable = Signal()  # type: ignore[assignment]
        self.writable.set()
        self._on_writable: Callable[[], None] | None = None
        self._handed_over = False
        self._abort_timer: asyncio.TimerHandle | None = None
        self._ping_tick: keepalive.Tick | None = None

    # -- keepalive: one shared timer per tick (see the module docstring) ---------------------

    def _one_timer(self) -> bool:
        return self.ping_timeout is not None and self.ping_timeout == self.ping_interval

    def schedule_ping(self) -> None:
        if not self._one_timer():
            super().schedule_ping()
            return
        assert self.ping_interval is not None
        self._ping_tick = keepalive.wheel(self.loop).add(self, self.ping_interval)

    def stop_keepalive(self) -> None:
        if self._ping_tick is not None:
            keepalive.wheel(self.loop).discard(self, self._ping_tick)
            self._ping_tick = None
        super().stop_keepalive()

    def keepalive_due(self) -> None:
        """The wheel's tick: drop the peer if the last ping went unanswered, else ping it."""
        self._ping_tick = None
        if self.close_sent or self.transport.is_closing() or self.conn.state is not State.OPEN:
            return
        if self.pending_ping_payload is not None:  # unanswered for ping_timeout
            self.keepalive_timeout()
            return
        # An unmasked, final ping frame with a random 4-byte payload (`handle_pong` matches it).
        payload = random.getrandbits(32).to_bytes(4, "big")
        self.pending_ping_payload = payload
        self.ping_sent_at = self.loop.time()
        # Written at once, not held for the step's end: the tick's timer is its own step.
        write = getattr(self.transport, "write_now", self.transport.write)
        write(b"\x89\x04" + payload)
        self.schedule_ping()

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None:
            scope["extensions"][WIRE] = self

    # -- server.transports.ws.wire.Wire ---------------------------------------------------------

    def attach(
        self, on_message: Callable[[Mapping[str, Any]], None], on_writable: Callable[[], None]
    ) -> None:
        self._on_writable = on_writable
        self.queue.forward_to(on_message)

    def detach(self) -> None:
        self._on_writable = None
        self.queue.forward_to(None)

    def hand_over(self) -> bool:
        self._handed_over = True
        return True

    async def close(self, code: int | None, reason: str, grace: float) -> None:
        """Send the close frame now, even when the peer stopped reading (it waits behind what
        the transport holds, for a peer that resumes), and abort the socket if it is still
        open `grace` seconds later: a consumer that never reads cannot keep it open."""
        if code is not None and not self.close_sent and not self.disconnected:
            self._send_close(code, reason)
        if self._handed_over and self.close_timer is None:
            self.transport.close()  # what uvicorn does when the ASGI call returns
        if not self.disconnected and self._abort_timer is None:
            self._abort_timer = self.loop.call_later(grace, self.abort)

    def _send_close(self, code: int, reason: str) -> None:
        # uvicorn's `send({"type": "websocket.close"})` without its wait for a writable
        # transport, which never comes for a peer that stopped reading.
        if self.transport.is_closing():
            return
        try:
            self.conn.send_close(code, reason)
        except InvalidState:  # the peer's close came first: uvicorn answers it
            return
        self.queue.put_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        self.resume_reading()  # the peer's closing frame completes the handshake
        # uvicorn's own timer; what bounds a peer that never reads is `close`'s abort.
        self.close_timer = self.loop.call_later(self.close_timeout, self.transport.close)

    def abort(self) -> None:
        """Drop the connection now: a reset, buffered frames discarded."""
        if self.disconnected:
            return
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._abort_timer is not None:
            self._abort_timer.cancel()
            self._abort_timer = None
        super().connection_lost(exc)

    async def run_asgi(self) -> None:
        """uvicorn's, except that the websocket stays open when the app returns after
        `hand_over()`: the gateway closes it (`close`) when the connection ends."""
        try:
            result = await self.app(self.scope, self.receive, self.send)
        except ClientDisconnected:
            pass
        except BaseException:
            self._handed_over = False
            self.logger.exception("Exception in ASGI application\n")
            self.send_500_response()
        else:
            if not self.handshake_complete:
                self.logger.error("ASGI callable returned without completing handshake.")
                self.send_500_response()
            elif result is not None:
                self.logger.error("ASGI callable should return None, but returned '%s'.", result)
        if self._handed_over:
            # Only the handshake and the ASGI call read the scope (its headers, the app
            # state's copy): an open connection need not keep it.
            self.scope = None  # type: ignore[assignment]
        elif self.close_timer is None:
            self.transport.close()

    def resume_reading(self) -> None:
        if self.read_paused and not self.disconnected:
            self.read_paused = False
            self.transport.resume_reading()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._on_writable is not None:
            self._on_writable()

    async def send(self, message: Any) -> None:
        await super().send(message)
        if message["type"] == "websocket.accept" and self.handshake_complete:
            # Only the handshake reads them; an open connection need not keep the headers.
            # (The request stays referenced by the websockets parser's generator frame for
            # the connection's life, so its headers are emptied, not just let go of.)
            self.request.headers.clear()
            self.response.headers.clear()
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
