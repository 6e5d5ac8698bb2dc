"""Websocket I/O: authenticate, then pump frames between the socket and a sans-I/O Session."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import weakref
from typing import Any

from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from realtime.closecodes import CloseCode
from realtime.hub import Hub
from realtime.outbox import Outbox
from runtime.domain import Origin, Principal
from runtime.errors import QuotaExceeded
from runtime.service.thread_service import ThreadService
from server.auth import (
    Grant,
    Unauthorized,
    grant,
    token_key,
    token_key_of_hash,
    websocket_credentials,
)
from server.live.inbox import ActionInbox
from server.live.presence import PresenceHub
from server.live.quotas import REFRESH_INTERVAL, ConnectionSlot, Limiter
from server.live.snapshot_deltas import SnapshotDeltas
from server.settings import Settings
from server.tracing import WS_CLOSES, WS_CONNECTIONS
from server.transports.ws.connection import Close, Connection, count
from server.transports.ws.session import Session
from server.transports.ws.token_recheck import TokenRecheck
from server.transports.ws.wire import Wire, close_websocket, wire_for

log = logging.getLogger(__name__)

_CLOSE_TIMEOUT = 2.0
_OUTBOX_CHECK_INTERVAL = 1.0
_SHUTDOWN_TIMEOUT = 5.0
# How often open connections' tokens are checked against storage: the path that closes them
# when a revocation message was lost (bus down). Expiry has a timer per connection.
TOKEN_RECHECK_INTERVAL = 5.0


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
        deltas: SnapshotDeltas | None = None,
    ) -> None:
        self.settings = settings
        self.deltas = deltas
        self.service = service
        self.hub = hub
        self.inbox = inbox
        self.presence = presence
        self.limiter = limiter
        self._connections: set[Connection] = set()
        self._slots: set[ConnectionSlot] = set()
        self._over: set[Connection] = set()  # connections whose outbox is over high water
        self._keeper: asyncio.Task[None] | None = None
        self._checker: asyncio.Task[None] | None = None
        self._rechecked = TokenRecheck()  # tokens found live at the last revocation count
        self._watchdog: asyncio.Task[None] | None = None
        self._closing = False
        # Tasks ending connections whose wire was handed over (see `serve`).
        self._ending: set[asyncio.Task[None]] = set()
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

    def _high_water(self, connection: Connection, over: bool) -> None:
        """An outbox went over high water (or back under): watch it while it is over."""
        if not over:
            self._over.discard(connection)
            return
        self._over.add(connection)
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.create_task(self._watch_outboxes(), name="ws-outboxes")

    async def _watch_outboxes(self) -> None:
        """One timer for the connections over high water: one whose transport stays paused (its
        peer stopped reading) and that is sent nothing more never calls into its outbox, yet
        its grace period must still expire. Idle connections are never visited."""
        while self._over:
            await asyncio.sleep(_OUTBOX_CHECK_INTERVAL)
            for connection in list(self._over):
                outbox = connection.outbox
                if outbox.over_high_water and not outbox.check():
                    connection.finish(Close(CloseCode.SLOW_CONSUMER, "slow consumer"))

    async def _recheck_tokens(self) -> None:
        store = self.service.store
        while self._connections:
            await asyncio.sleep(TOKEN_RECHECK_INTERVAL)
            stored = {c.token_hash for c in self._connections if c.token_hash and c.stored_token}
            if not stored:
                continue
            try:
                # One row while nothing was revoked; then one read for every open connection's
                # token (or the new ones'), not one per token.
                asked = self._rechecked.to_read(await store.revocation_count(), stored)
                live = await store.live_tokens(asked)  # none asked: no read
            except Exception:
                continue  # storage down: leave connections alone, check again later
            self._rechecked.found_live(live)
            for token_hash in asked - live:
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
        token, subprotocol = websocket_credentials(
            websocket.scope.get("subprotocols") or (),
            websocket.headers,
            websocket.query_params.get("token"),
        )
        # Accept first: a close code (4401) can only be sent on an open websocket.
        await websocket.accept(subprotocol)
        if self._closing:
            await _close(websocket, Close(CloseCode.GOING_AWAY, "server shutting down"))
            return
        try:
            token_grant = await grant(self.service.store, token)
        except Unauthorized as exc:
            await _close(websocket, Close(CloseCode.UNAUTHORIZED, exc.message))
            return
        except Exception:
            log.exception("websocket authentication failed")
            await _close(websocket, Close(CloseCode.INTERNAL_ERROR, "internal error"))
            return
        token_hash = token_grant.token_hash
        principal = self._principals.setdefault(token_hash, token_grant.principal)
        token_grant = dataclasses.replace(token_grant, principal=principal)
        slot: ConnectionSlot | None = None
        if self.limiter is not None:
            try:
                slot = await self.limiter.connect(principal, token_key(token or ""))
            except QuotaExceeded as exc:
                await _close(websocket, Close(CloseCode.TOO_MANY_CONNECTIONS, exc.message[:120]))
                return
            self._slots.add(slot)
            self._keep_slots()
        wire = wire_for(websocket)
        try:
            connection = self._open(wire, token_grant, _origin(websocket))
        except BaseException:
            await self._release(slot)
            raise
        if wire.hand_over():
            # The ASGI call returns now and its coroutines with it; the connection lives on
            # in the wire's callbacks, and a task of its own ends it.
            connection.when_finished(lambda: self._end_later(connection, wire, slot))
            return
        try:
            await connection.finished()
        finally:
            await self._end(connection, wire, slot)

    def _open(
        self,
        wire: Wire,
        token: Grant,
        origin: Origin,
    ) -> Connection:
        principal, token_hash = token.principal, token.token_hash
        connection: Connection | None = None

        def overflowed() -> None:
            if connection is not None:
                connection.finish(Close(CloseCode.SLOW_CONSUMER, "slow consumer"))

        def high_water(over: bool) -> None:
            if connection is not None:
                self._high_water(connection, over)

        outbox = Outbox(
            self.settings.ws_outbox_max_bytes,
            grace=self.settings.ws_slow_consumer_grace,
            on_overflow=overflowed,
            on_high_water=high_water,
            # Every subscribed thread keeps its floor; unsubscribed ones are forgotten.
            max_floors=self.settings.ws_max_subscriptions,
        )
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
            origin=origin.model_copy(update={"token_id": token_key_of_hash(token_hash)}),
            token=token,
            deltas=self.deltas,
        )
        connection = Connection(wire, session, self.settings)
        # An issuer's JWT is not in storage: nothing there to recheck; it lives until `exp`.
        connection.follow(token)
        session.on_refresh = connection.follow
        self._connections.add(connection)
        self._check_tokens()
        count(WS_CONNECTIONS, 1)
        connection.start()
        return connection

    def _end_later(self, connection: Connection, wire: Wire, slot: ConnectionSlot | None) -> None:
        task = asyncio.create_task(self._end(connection, wire, slot), name="ws-end")
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)

    async def _end(self, connection: Connection, wire: Wire, slot: ConnectionSlot | None) -> None:
        """Release what the connection holds, close the websocket as it decided, then give
        back its connection slot."""
        try:
            try:
                close = await connection.stop()
            finally:
                self._connections.discard(connection)
                self._over.discard(connection)
                count(WS_CONNECTIONS, -1)
            if close is not None:
                count(WS_CLOSES, 1, code=int(close.code))
            # A peer that stopped reading cannot hold the close up: the wire sends the close
            # frame behind what it holds and aborts the socket after the grace.
            grace = self.settings.ws_close_grace
            with contextlib.suppress(Exception):
                async with asyncio.timeout(grace + _CLOSE_TIMEOUT):
                    await wire.close(
                        close.code if close else None, close.reason if close else "", grace
                    )
        finally:
            await self._release(slot)

    async def _release(self, slot: ConnectionSlot | None) -> None:
        if slot is not None and self.limiter is not None:
            self._slots.discard(slot)
            with contextlib.suppress(Exception):
                await self.limiter.disconnect(slot)

    def _keep_slots(self) -> None:
        # One task per gateway refreshes every slot's expiry, so a crashed gateway's slots
        # lapse on their own while live ones never do.
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.create_task(self._refresh_slots(), name="ws-slots")

    async def _refresh_slots(self) -> None:
        assert self.limiter is not None
        while self._slots:
            await asyncio.sleep(REFRESH_INTERVAL)
            with contextlib.suppress(Exception):
                await self.limiter.keep_many(list(self._slots))

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
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_SHUTDOWN_TIMEOUT):
                if connections:
                    await asyncio.wait([c.done for c in connections])
                if self._ending:  # handed-over connections still sending their close frames
                    await asyncio.wait(list(self._ending))


async def _close(websocket: WebSocket, close: Close) -> None:
    # A peer that stopped reading cannot block the close forever.
    with contextlib.suppress(Exception):
        async with asyncio.timeout(_CLOSE_TIMEOUT):
            await close_websocket(websocket, close.code, close.reason)


async def websocket_endpoint(websocket: WebSocket) -> None:
    gateway: Gateway | None = getattr(websocket.app.state, "gateway", None)
    if gateway is None:  # not started, or already stopped
        await websocket.close(CloseCode.GOING_AWAY)
        return
    await gateway.serve(websocket)


class WebSocketDispatch:
    """ASGI middleware: a websocket on `route`'s path goes straight to its endpoint.

    Starlette's exception middleware and router have nothing to do for it (the gateway
    answers every failure with a close code), so its ASGI call is a few frames instead of a
    dozen: while the connection is set up, and for its whole life where the wire cannot be
    handed over (`AsgiWire`), when the call lasts as long as the connection. The route stays
    in the app's table, where it declares the endpoint (and would serve it without this).
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


def _origin(websocket: WebSocket) -> Origin:
    """Where a connection's commands come from, for the audit log."""
    client = websocket.client
    return Origin(
        transport="websocket",
        client_address=client.host if client else None,
        user_agent=websocket.headers.get("user-agent"),
    )
