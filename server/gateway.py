"""Websocket I/O: authenticate, then pump frames between the socket and a sans-I/O Session."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from realtime.closecodes import CloseCode
from realtime.hub import Hub
from realtime.outbox import Outbox, OutboxClosedError, SlowConsumerError
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
from server.wsprotocol import SEND_NOW, SendNow

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
    """One accepted websocket: a reader, and a writer draining what the outbox queued.

    Whichever of them finishes first (or `finish()`, called by the gateway's outbox watchdog,
    a revocation or shutdown) decides how the connection closes; the other is cancelled and
    awaited. Nothing here touches any other connection. Futures, not Events, and no timer of
    its own: an idle connection should hold little (docs/operations.md, "Fan-out").
    """

    def __init__(self, websocket: WebSocket, session: Session, settings: Settings) -> None:
        self.websocket = websocket
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
        self._inflight: asyncio.Future[None] | None = None
        # Done once the connection released everything (tasks, hub listeners, outbox).
        self.done: asyncio.Future[None] = loop.create_future()
        # The writer holds a frame taken from the outbox and not yet written.
        self._sending = False
        send_now: SendNow | None = websocket.scope.get("extensions", {}).get(SEND_NOW)
        if send_now is not None:
            self._send_now = send_now
            self.outbox.direct = self._direct

    def _direct(self, data: bytes) -> bool:
        """The outbox's synchronous path: write now unless the writer is mid-frame."""
        if self._sending or self._finished.done():
            return False
        return self._send_now(data)

    def finish(self, close: Close | None) -> None:
        if not self._finished.done():
            self._close = close
            self._finished.set_result(None)

    async def run(self) -> Close | None:
        tasks = [
            asyncio.create_task(self._guard(self._read()), name="ws-read"),
            asyncio.create_task(self._guard(self._write()), name="ws-write"),
        ]
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
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._inflight is not None and not self._inflight.done():
                await asyncio.wait({self._inflight}, timeout=_COMMAND_GRACE)
            try:
                await self.session.close()
            finally:
                self.outbox.close()
                self.done.set_result(None)
        return self._close

    async def _guard(self, work: Coroutine[Any, Any, Close | None]) -> None:
        try:
            self.finish(await work)
        except asyncio.CancelledError:
            raise
        except (WebSocketDisconnect, OSError, RuntimeError) as exc:
            # The peer went away mid-send or mid-receive; nothing left to tell it.
            log.debug("websocket ended: %r", exc)
            self.finish(None)
        except Exception:
            log.exception("websocket connection failed")
            self.finish(Close(CloseCode.INTERNAL_ERROR, "internal error"))

    async def _read(self) -> Close | None:
        while True:
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                return None
            text = message.get("text")
            data: str | bytes | None = text if text is not None else message.get("bytes")
            if data is None:
                continue
            if self._too_big(data):
                return Close(CloseCode.TOO_BIG, "frame too large")
            # Shielded: a command the client sent is carried out even if the client leaves
            # while it runs (a closed tab must not half-apply a command).
            self._inflight = asyncio.ensure_future(self.session.feed(data))
            await asyncio.shield(self._inflight)
            _count(WS_FRAMES_IN, 1)

    def _too_big(self, data: str | bytes) -> bool:
        size = len(data)
        if isinstance(data, str) and size * 4 > self.max_frame_bytes >= size:
            size = len(data.encode("utf-8"))  # only measured when characters could be wide
        return size > self.max_frame_bytes

    async def _write(self) -> Close | None:
        try:
            while True:
                data = await self.outbox.get()
                self._sending = True
                await self.websocket.send_text(data.decode("utf-8"))
                self._sending = False
        except SlowConsumerError:
            return Close(CloseCode.SLOW_CONSUMER, "slow consumer")
        except OutboxClosedError:
            return None



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
        """One timer for every connection: a writer stuck in a send never calls into its
        outbox, yet the grace period of one over high water must still expire."""
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
        try:
            expires_at = await self._expiry(hash_token(token or ""))
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
            await self._serve(websocket, principal, hash_token(token or ""), expires_at)
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
        connection = Connection(websocket, session, self.settings)
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
    if gateway is None:
        await websocket.close(CloseCode.GOING_AWAY)
        return
    await gateway.serve(websocket)
