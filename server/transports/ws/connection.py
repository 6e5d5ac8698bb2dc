"""One accepted websocket: frames between its `Wire` and its sans-I/O `Session`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from realtime.closecodes import CloseCode
from server.auth import Grant
from server.settings import Settings
from server.tracing import WS_FRAMES_IN
from server.transports.ws.deadlines import Deadline, deadlines
from server.transports.ws.session import Session
from server.transports.ws.wire import Wire

log = logging.getLogger(__name__)

# How long a command already being carried out may finish after its client left.
_COMMAND_GRACE = 10.0


@dataclass(frozen=True)
class Close:
    code: CloseCode
    reason: str = ""


def count(counter: object, amount: int, **attributes: str | int) -> None:
    with contextlib.suppress(Exception):  # telemetry never affects a connection
        counter.add(amount, attributes)  # type: ignore[attr-defined]


class Connection:
    """One accepted websocket, driven by its `Wire`'s callbacks: no task of its own while idle.

    Received frames are fed to the session one at a time by a short-lived task (reading stays
    paused meanwhile, as with ASGI `receive()`); frames to send go straight to the socket while
    nothing is queued, else wait in the outbox until the wire is writable again. Whatever ends
    first (the peer leaving, a closing frame, a slow consumer, a revocation, shutdown) calls
    `finish()`, which decides how the connection closes; the gateway then calls `stop()`.
    Nothing here touches any other connection, and an idle one holds little
    (docs/operations.md, "Fan-out").
    """

    __slots__ = (
        "_close",
        "_expiry",
        "_feeder",
        "_finished",
        "_pending",
        "done",
        "expires_at",
        "max_frame_bytes",
        "outbox",
        "session",
        "stored_token",
        "token_hash",
        "wire",
    )

    def __init__(self, wire: Wire, session: Session, settings: Settings) -> None:
        self.wire = wire
        self.session = session
        self.outbox = session.outbox
        self.max_frame_bytes = settings.ws_max_frame_bytes
        loop = asyncio.get_running_loop()
        self._finished: asyncio.Future[None] = loop.create_future()
        self._close: Close | None = None
        # Set by the gateway: which token this connection authenticated with, and when (event
        # loop time) that token expires, if it does.
        self.token_hash = ""
        self.stored_token = True  # a `tl_` token, which storage can revoke
        self.expires_at: float | None = None
        self._expiry: Deadline | None = None
        # Frames received and not yet fed; the task feeding them, while there are any.
        self._pending: list[str | bytes | None] | None = None
        self._feeder: asyncio.Task[None] | None = None
        # Done once the connection released everything (hub listeners, outbox).
        self.done: asyncio.Future[None] = loop.create_future()

    def finish(self, close: Close | None) -> None:
        if not self._finished.done():
            self._close = close
            self._finished.set_result(None)

    def start(self) -> None:
        """Take the wire's callbacks and the outbox's sends from now on."""
        self.outbox.direct = self._send_now
        self.wire.attach(self._received, self._writable)
        self._arm()

    def _arm(self) -> None:
        timers = deadlines(asyncio.get_running_loop())
        if self._expiry is not None:
            timers.cancel(self._expiry)
            self._expiry = None
        if self.expires_at is not None:
            # A deadline, not a task: the token's last second is its last, not the next check.
            # One heap entry; the loop's one timer is for the earliest of all connections'.
            self._expiry = timers.at(self.expires_at, self)

    def expired(self) -> None:
        """The token's expiry came (`deadlines`)."""
        self._expiry = None
        self.finish(Close(CloseCode.TOKEN_REVOKED, "token expired"))

    def follow(self, token: Grant) -> None:
        """Run on a refreshed token (`auth.refresh`): its revocation and expiry close the
        connection from now on, the previous token's no longer."""
        self.token_hash = token.token_hash
        self.stored_token = token.stored
        remaining = token.expires_in
        loop = asyncio.get_running_loop()
        self.expires_at = None if remaining is None else loop.time() + remaining
        if not self._finished.done():
            self._arm()

    def when_finished(self, callback: Callable[[], None]) -> None:
        """Call `callback` (once) when something has decided the connection ends."""
        self._finished.add_done_callback(lambda _: callback())

    async def finished(self) -> None:
        await asyncio.shield(self._finished)

    async def stop(self) -> Close | None:
        """Release everything the connection holds; how it is to be closed (None: the peer
        left, or the wire is gone)."""
        if self._expiry is not None:
            deadlines(asyncio.get_running_loop()).cancel(self._expiry)
            self._expiry = None
        self.wire.detach()
        self.outbox.direct = None
        try:
            # A command the client sent is carried out even if the client left while it ran
            # (a closed tab must not half-apply a command); what was not started is dropped.
            if self._feeder is not None and not self._feeder.done():
                await asyncio.wait({self._feeder}, timeout=_COMMAND_GRACE)
            await self.session.close()
        finally:
            self.outbox.close()
            if not self.done.done():
                self.done.set_result(None)
        return self._close

    # -- wire callbacks -------------------------------------------------------------------

    def _send_now(self, data: bytes) -> bool:
        # Nothing more goes out once the connection is finishing (e.g. its token was revoked).
        return not self._finished.done() and self.wire.send_now(data)

    def _received(self, message: Mapping[str, Any]) -> None:
        if message["type"] == "websocket.disconnect":
            # Frames that arrived before it are still fed (the feeder finishes after them).
            if self._feeder is None or self._feeder.done():
                self.finish(None)
            else:
                self._queue(None)
            return
        text = message.get("text")
        data: str | bytes | None = text if text is not None else message.get("bytes")
        if data is None or self._finished.done():
            self.wire.resume_reading()
            return
        if self._too_big(data):
            self.finish(Close(CloseCode.TOO_BIG, "frame too large"))
            return
        self._queue(data)

    def _queue(self, data: str | bytes | None) -> None:
        if self._pending is None:
            self._pending = []
        self._pending.append(data)  # None: the peer left
        if self._feeder is None or self._feeder.done():
            self._feeder = asyncio.create_task(self._feed(), name="ws-feed")

    async def _feed(self) -> None:
        pending = self._pending
        assert pending is not None
        try:
            while pending and not self._finished.done():
                data = pending.pop(0)
                if data is None:
                    self.finish(None)
                    return
                await self.session.feed(data)
                count(WS_FRAMES_IN, 1)
                if not pending:
                    self.wire.resume_reading()
        except (OSError, RuntimeError) as exc:
            log.debug("websocket ended: %r", exc)
            self.finish(None)
        except Exception:
            log.exception("websocket connection failed")
            self.finish(Close(CloseCode.INTERNAL_ERROR, "internal error"))
        finally:
            # An idle connection keeps neither the queue nor the finished task.
            self._pending = None
            if self._feeder is asyncio.current_task():
                self._feeder = None

    def _writable(self) -> None:
        if not self._finished.done():
            self.outbox.flush()

    def _too_big(self, data: str | bytes) -> bool:
        size = len(data)
        if isinstance(data, str) and size * 4 > self.max_frame_bytes >= size:
            size = len(data.encode("utf-8"))  # only measured when characters could be wide
        return size > self.max_frame_bytes
