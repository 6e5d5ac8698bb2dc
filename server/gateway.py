"""Websocket I/O: authenticate, then pump frames between the socket and a sans-I/O Session."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketState

from realtime.closecodes import CloseCode
from realtime.hub import Hub
from realtime.outbox import Outbox
from runtime.domain import Principal
from runtime.errors import QuotaExceeded
from runtime.service import ThreadService
from server.auth import authenticate, bearer_token, hash_token, token_key, token_key_of_hash
from server.errors import Unauthorized
from server.inbox import ActionInbox
from server.limits import REFRESH_INTERVAL, ConnectionSlot, Limiter
from server.presence import PresenceHub
from server.session import Session
from server.settings import Settings
from server.telemetry import WS_CLOSES, WS_CONNECTIONS, WS_FRAMES_IN
from server.wire import Wire, wire_for

log = logging.getLogger(__name__)

_CLOSE_TIMEOUT = 2.0
_OUTBOX_CHECK_INTERVAL = 1.0
_SHUTDOWN_TIMEOUT = 5.0
_COMMAND_GRACE = 10.0
# How often open connections' tokens are checked against storage: the path that closes them
# when a revocation message was lost (bus down). Expiry has a timer per connection.
TOKEN_RECHECK_INTERVAL = 5.0


@dataclass(frozen=True)
class Close:
    code: CloseCode
    reason: str = ""


def _count(counter: object, amount: int, **attributes: str | int) -> None:
    with contextlib.suppress(Exception):  # telemetry never affects a connection
        counter.add(amount, attributes)  # type: ignore[attr-defined]


class Connection:
    """One accepted websocket, driven by its `Wire`'s callbacks: no task of its own while idle.

    Received frames are fed to the session one at a time by a short-lived task (reading stays
    paused meanwhile, as with ASGI `receive()`); frames to send go straight to the socket while
    nothing is queued, else wait in the outbox until the wire is writable again. Whatever ends
    first (the peer leaving, a closing frame, a slow consumer, a revocation, shutdown) calls
    `finish()`, which decides how the connection closes. Nothing here touches any other
    connection, and an idle one holds little (docs/operations.md, "Fan-out").
    """

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
        self.expires_at: float | None = None
        # Frames received and not yet fed; the task feeding them, while there are any.
        self._pending: list[str | bytes | None] | None = None
        self._feeder: asyncio.Task[None] | None = None
        # Done once the connection released everything (hub listeners, outbox).
        self.done: asyncio.Future[None] = loop.create_future()

    def finish(self, close: Close | None) -> None:
        if not self._finished.done():
            self._close = close
            self._finished.set_result(None)

    async def run(self) -> Close | None:
        self.outbox.direct = self._send_now
        self.wire.attach(self._received, self._writable)
        # A timer, not a task: the token's last second is its last, not the next periodic check.
        expiry = None
        if self.expires_at is not None:
            expiry = asyncio.get_running_loop().call_at(
                self.expires_at, self.finish, Close(CloseCode.TOKEN_REVOKED, "token expired")
            )
        try:
            await asyncio.shield(self._finished)
        finally:
            if expiry is not None:
                expiry.cancel()
            self.wire.detach()
            self.outbox.direct = None
            # A command the client sent is carried out even if the client left while it ran
            # (a closed tab must not half-apply a command); what was not started is dropped.
            if self._feeder is not None and not self._feeder.done():
                await asyncio.wait({self._feeder}, timeout=_COMMAND_GRACE)
            try:
                await self.session.close()
            finally:
                self.outbox.close()
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
                _count(WS_FRAMES_IN, 1)
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


class Gateway:
    """Accepts websockets for the app; tracks connections so shutdown can close them."""

    def __init__(
        self,
        settings: Settings,
        service: ThreadService,
        hub: Hub,
        inbox: ActionInbox | None = None,
        presence: PresenceHub | None = None,
        limiter: Limiter | None = None,
    ) -> None:
        self.settings = settings
        self.service = service
        self.hub = hub
        self.inbox = inbox
        self.presence = presence
        self.limiter = limiter
        self._connections: set[Connection] = set()
        self._slots: set[ConnectionSlot] = set()
        self._keeper: asyncio.Task[None] | None = None
        self._checker: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._closing = False
        # One Principal per token among its open connections (a user's tabs share a token):
        # what a token authenticates as never changes while it is valid.
        self._principals: weakref.WeakValueDictionary[str, Principal] = (
            weakref.WeakValueDictionary()
        )

    async def revoke(self, key: str) -> int:
        """Close every connection of the token `key` names (token_key) with 4403."""
        closed = 0
        for connection in list(self._connections):
            if token_key_of_hash(connection.token_hash) == key:
                connection.finish(Close(CloseCode.TOKEN_REVOKED, "token revoked"))
                closed += 1
        return closed

    def _check_tokens(self) -> None:
        if self._checker is None or self._checker.done():
            self._checker = asyncio.create_task(self._recheck_tokens(), name="ws-tokens")
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.create_task(self._watch_outboxes(), name="ws-outboxes")

    async def _watch_outboxes(self) -> None:
        """One timer for every connection: a connection whose transport stays paused (its peer
        stopped reading) and that is sent nothing more never calls into its outbox, yet the
        grace period of one over high water must still expire."""
        while self._connections:
            await asyncio.sleep(_OUTBOX_CHECK_INTERVAL)
            for connection in list(self._connections):
                outbox = connection.outbox
                if outbox.over_high_water and not outbox.check():
                    connection.finish(Close(CloseCode.SLOW_CONSUMER, "slow consumer"))

    async def _recheck_tokens(self) -> None:
        while self._connections:
            await asyncio.sleep(TOKEN_RECHECK_INTERVAL)
            for token_hash in {c.token_hash for c in self._connections if c.token_hash}:
                try:
                    valid = await self.service.store.principal_for_token(token_hash)
                except Exception:
                    continue  # storage down: leave connections alone, check again later
                if valid is None:
                    await self.revoke(token_key_of_hash(token_hash))

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    async def serve(self, websocket: WebSocket) -> None:
        allowed = self.settings.ws_allowed_origins
        if allowed and websocket.headers.get("origin", "") not in allowed:
            # Closing before accepting refuses the upgrade itself: the browser sees HTTP 403.
            await websocket.close(CloseCode.UNAUTHORIZED)
            return
        # Accept first: a close code (4401) can only be sent on an open websocket.
        await websocket.accept()
        if self._closing:
            await _close(websocket, Close(CloseCode.GOING_AWAY, "server shutting down"))
            return
        token = websocket.query_params.get("token") or bearer_token(websocket.headers)
        try:
            principal = await authenticate(self.service.store, token)
        except Unauthorized as exc:
            await _close(websocket, Close(CloseCode.UNAUTHORIZED, exc.message))
            return
        except Exception:
            log.exception("websocket authentication failed")
            await _close(websocket, Close(CloseCode.INTERNAL_ERROR, "internal error"))
            return
        token_hash = hash_token(token or "")
        principal = self._principals.setdefault(token_hash, principal)
        try:
            expires_at = await self._expiry(token_hash)
        except Exception:
            log.exception("token expiry lookup failed")
            await _close(websocket, Close(CloseCode.INTERNAL_ERROR, "internal error"))
            return
        slot: ConnectionSlot | None = None
        if self.limiter is not None:
            try:
                slot = await self.limiter.connect(principal, token_key(token or ""))
            except QuotaExceeded as exc:
                await _close(websocket, Close(CloseCode.TOO_MANY_CONNECTIONS, exc.message[:120]))
                return
            self._slots.add(slot)
            self._keep_slots()
        try:
            await self._serve(websocket, principal, token_hash, expires_at)
        finally:
            if slot is not None and self.limiter is not None:
                self._slots.discard(slot)
                with contextlib.suppress(Exception):
                    await self.limiter.disconnect(slot)

    async def _expiry(self, token_hash: str) -> float | None:
        """When (event loop time) the token expires: the database says how many seconds are
        left on its clock, so gateways with skewed clocks still agree."""
        remaining = await self.service.store.token_expires_in(token_hash)
        if remaining is None:
            return None
        return asyncio.get_running_loop().time() + remaining

    def _keep_slots(self) -> None:
        # One task per gateway refreshes every slot's expiry, so a crashed gateway's slots
        # lapse on their own while live ones never do.
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.create_task(self._refresh_slots(), name="ws-slots")

    async def _refresh_slots(self) -> None:
        assert self.limiter is not None
        while self._slots:
            await asyncio.sleep(REFRESH_INTERVAL)
            for slot in list(self._slots):
                with contextlib.suppress(Exception):
                    await self.limiter.keep(slot)

    async def _serve(
        self,
        websocket: WebSocket,
        principal: Principal,
        token_hash: str,
        expires_at: float | None,
    ) -> None:
        connection: Connection | None = None

        def overflowed() -> None:
            if connection is not None:
                connection.finish(Close(CloseCode.SLOW_CONSUMER, "slow consumer"))

        outbox = Outbox(self.settings.ws_outbox_max_bytes, on_overflow=overflowed)
        session = Session(
            principal,
            self.service,
            self.hub,
            outbox,
            max_subscriptions=self.settings.ws_max_subscriptions,
            limiter=self.limiter,
            token_id=token_key_of_hash(token_hash),
            inbox=self.inbox,
            presence=self.presence,
        )
        connection = Connection(wire_for(websocket), session, self.settings)
        connection.token_hash = token_hash
        connection.expires_at = expires_at
        self._connections.add(connection)
        self._check_tokens()
        _count(WS_CONNECTIONS, 1)
        try:
            close = await connection.run()
        finally:
            self._connections.discard(connection)
            _count(WS_CONNECTIONS, -1)
        if close is not None:
            _count(WS_CLOSES, 1, code=int(close.code))
            await _close(websocket, close)

    async def close(self) -> None:
        """Close every connection with 1001 and wait (bounded) for them to finish."""
        self._closing = True
        for task in (self._keeper, self._checker, self._watchdog):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        connections = list(self._connections)
        for connection in connections:
            connection.finish(Close(CloseCode.GOING_AWAY, "server shutting down"))
        if connections:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_SHUTDOWN_TIMEOUT):
                    await asyncio.wait([c.done for c in connections])


async def _close(websocket: WebSocket, close: Close) -> None:
    if websocket.application_state is WebSocketState.DISCONNECTED:
        return
    # A peer that stopped reading cannot block the close forever.
    with contextlib.suppress(Exception):
        async with asyncio.timeout(_CLOSE_TIMEOUT):
            await websocket.close(close.code, close.reason)


async def websocket_endpoint(websocket: WebSocket) -> None:
    gateway: Gateway | None = getattr(websocket.app.state, "gateway", None)
    if gateway is None:  # not started, or already stopped
        await websocket.close(CloseCode.GOING_AWAY)
        return
    await gateway.serve(websocket)


class WebSocketDispatch:
    """ASGI middleware: a websocket on `route`'s path goes straight to its endpoint.

    An open websocket keeps the coroutines of its ASGI call alive for as long as it is open.
    Ahead of Starlette's exception middleware and router (which have nothing to do for it:
    the gateway answers every failure with a close code), that chain is a few frames instead
    of a dozen, which is a good part of what an idle tab costs the gateway. The route stays in
    the app's table, where it declares the endpoint (and would serve it without this).
    """

    def __init__(self, app: Any, route: WebSocketRoute) -> None:
        self.app = app
        self.path = route.path
        self.endpoint = route.endpoint

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket" and scope["path"] == self.path:
            await self.endpoint(WebSocket(scope, receive, send))
        else:
            await self.app(scope, receive, send)
