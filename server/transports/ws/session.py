"""Sans-I/O websocket session: feed it decoded client frames, it queues answers in an outbox."""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias

import orjson

from realtime.envelopes import MessageKind, chunk_position, encode_invalidate
from realtime.outbox import Outbox
from runtime.authorization import ThreadMatch
from runtime.domain import Origin, Principal
from runtime.errors import InvalidInput, NotFound
from runtime.service.assigned import wire_refusal
from runtime.service.thread_service import ThreadService
from server.auth import Grant, grant, token_key_of_hash
from server.live.inbox import ActionInbox
from server.live.presence import Member, PresenceHub
from server.live.quotas import Limiter
from server.live.snapshot_cache import viewer_key
from server.live.snapshot_deltas import SnapshotDeltas
from server.protocol.client_frames import Frame, FrameError, decode_frame
from server.protocol.command_model import Caller
from server.protocol.commands import BY_NAME
from server.protocol.wire_errors import WireError, wire_error
from threadline_wire.frames import Subscribed

log = logging.getLogger(__name__)

MAX_SUBSCRIPTIONS = 256
# Outbox kind of direct answers: not coalesced, sent in order with the chunks around them.
ANSWER = "answer"


@dataclass(frozen=True)
class _Build:
    """An invalidation waiting in a delta listener for its frame, and the version it announces."""

    frame: asyncio.Future[tuple[bytes, int]]
    version: int


# What waits in a delta listener: a build, or a frame behind one (data, kind, version).
_Waiting: TypeAlias = "_Build | tuple[bytes, MessageKind, int | None]"


class ThreadReader(Protocol):
    """The two store reads a session needs (scope check and current version)."""

    async def thread_version(self, thread_id: str, scopes: Collection[str]) -> int: ...
    async def thread_versions(self, thread_ids: Sequence[str]) -> dict[str, int]: ...


class Listening(Protocol):
    """The process's fan-out hub (realtime.hub.Hub) as the session uses it."""

    async def add(self, thread_id: str, listener: Any) -> None: ...
    async def remove(self, thread_id: str, listener: Any) -> None: ...
    async def replay(self, thread_id: str) -> list[bytes]: ...


class SessionState(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"


class SessionClosedError(RuntimeError):
    pass


# Asks the gateway's delta builder for the frame announcing a version (server.live.snapshot_deltas).
DeltaRequest: TypeAlias = Callable[[str, int], "asyncio.Future[tuple[bytes, int]]"]


@dataclass(eq=False, slots=True)
class ThreadListener:
    """Hub listener of one subscribed thread: holds live frames back until `subscribed` is out.

    The hub delivers from the moment the listener is added, but the client must see
    `subscribed` and the replay of the in-flight step first; frames arriving meanwhile wait
    here. A chunk is published and appended to the replay buffer concurrently, so one the replay
    already had can arrive live before or after `open`: per run, live chunks at or before the
    replay's last (episode, seq) are dropped until the first newer one passes.

    With `deltas` (the client subscribed with `"deltas": true`), an invalidation waits for the
    gateway to build its frame with the snapshot delta, and the thread's frames after it wait
    behind it, so the client sees them in the order the bus delivered them.
    """

    thread_id: str
    outbox: Outbox
    floor: int | None = None
    held: list[tuple[bytes, MessageKind, int | None]] | None = field(default_factory=list)
    replayed: dict[str, tuple[int, int]] = field(default_factory=dict)
    deltas: DeltaRequest | None = None
    closed: bool = False
    _waiting: deque[_Waiting] = field(default_factory=deque, init=False, repr=False)

    def deliver(self, data: bytes, kind: MessageKind, version: int | None) -> None:
        if self.held is not None:
            self.held.append((data, kind, version))
            return
        self._put(data, kind, version)

    def _put(self, data: bytes, kind: MessageKind, version: int | None) -> None:
        # The client got `floor` in `subscribed`; it needs only newer versions.
        stale = version is not None and self.floor is not None and version <= self.floor
        if kind == "invalidate" and stale:
            return
        if kind == "chunk" and self.replayed and self._replayed_already(data):
            return
        if kind == "invalidate" and version is not None and self.deltas is not None:
            self._wait(_Build(self.deltas(self.thread_id, version), version))
        elif self._waiting:
            self._wait((data, kind, version))
        else:
            self.outbox.put(data, kind, self.thread_id, version)

    def _wait(self, item: _Waiting) -> None:
        self._waiting.append(item)
        if len(self._waiting) == 1:
            self._flush()

    def _flush(self, _: object = None) -> None:
        """Send what waits, in order, up to the first delta still being built."""
        waiting = self._waiting
        while waiting:
            head = waiting[0]
            if isinstance(head, _Build):
                build = head.frame
                if not build.done():
                    build.add_done_callback(self._flush)
                    return
                waiting.popleft()
                if build.cancelled() or build.exception() is not None:
                    data, version = encode_invalidate(self.thread_id, head.version), head.version
                else:
                    data, version = build.result()
                if not self.closed:
                    self.outbox.put(data, "invalidate", self.thread_id, version)
            else:
                waiting.popleft()
                if not self.closed:
                    self.outbox.put(head[0], head[1], self.thread_id, head[2])

    def _replayed_already(self, data: bytes) -> bool:
        position = chunk_position(data)
        if position is None or position.run_id not in self.replayed:
            return False
        if position.order <= self.replayed[position.run_id]:
            return True
        del self.replayed[position.run_id]  # live has moved past the replay: stop parsing
        return False

    def open(self, version: int, replay: list[bytes]) -> None:
        """Send the replay, then what was held, without the chunks the replay already had."""
        self.floor = version
        for data in replay:
            position = chunk_position(data)
            if position is not None:
                last = self.replayed.get(position.run_id)
                self.replayed[position.run_id] = max(last or position.order, position.order)
            self.outbox.put(data, "chunk", self.thread_id)
        held, self.held = self.held or [], None
        for data, kind, item_version in held:
            self._put(data, kind, item_version)


class Session:
    """One websocket connection's protocol state, with no socket in it.

    `feed()` takes a client frame (text or bytes), runs it, and queues the answer (and any
    subscription traffic) in `outbox`; the gateway writes the outbox to the socket. Every
    failure of a frame becomes an error frame: the connection itself never fails because of
    one frame.
    """

    def __init__(
        self,
        principal: Principal,
        service: ThreadService,
        hub: Listening,
        outbox: Outbox,
        *,
        max_subscriptions: int = MAX_SUBSCRIPTIONS,
        inbox: ActionInbox | None = None,
        presence: PresenceHub | None = None,
        limiter: Limiter | None = None,
        token_id: str = "",
        origin: Origin | None = None,
        token: Grant | None = None,
        on_refresh: Callable[[Grant], None] | None = None,
        deltas: SnapshotDeltas | None = None,
    ) -> None:
        self.principal = principal
        # The gateway's delta builder, for subscriptions asking for deltas (None: none are sent).
        self.deltas = deltas
        self._viewer_of: tuple[Principal, str] | None = None
        # The token the connection runs on (None: it cannot refresh), and who re-arms its expiry.
        self.grant = token
        self.on_refresh = on_refresh
        self.origin = origin
        self.service = service
        self.hub = hub
        self.outbox = outbox
        self.max_subscriptions = max_subscriptions
        self.limiter = limiter
        self.token_id = token_id
        self.state = SessionState.OPEN
        self._listeners: dict[str, ThreadListener] = {}
        self.inbox = inbox
        self.presence = presence
        self._members: dict[str, Member] = {}
        self._inbox_listeners: dict[str, Callable[[bytes], None]] = {}

    def _viewer(self) -> str:
        """`viewer_key` of the connection's principal, kept while it stays the same one (an
        `auth.refresh` may replace it)."""
        kept = self._viewer_of
        if kept is None or kept[0] is not self.principal:
            kept = self._viewer_of = (self.principal, viewer_key(self.principal))
        return kept[1]

    @property
    def subscriptions(self) -> list[str]:
        return list(self._listeners)

    @property
    def store(self) -> ThreadReader:
        reader: ThreadReader = self.service.store
        return reader

    # --- input --------------------------------------------------------------------------

    async def feed(self, raw: str | bytes) -> None:
        """Handle one client frame; its answer (or error frame) is queued in the outbox."""
        if self.state is not SessionState.OPEN:
            raise SessionClosedError("the session is closed")
        try:
            frame = decode_frame(raw)
        except FrameError as exc:
            self._answer(wire_error(exc).frame(exc.frame_id))
            return
        try:
            await self.handle(frame)
        except Exception as exc:
            self._answer(wire_error(exc, invalid="invalid input").frame(frame.id))

    async def handle(self, frame: Frame) -> None:
        """Run one validated frame: the table's command, the same one HTTP runs."""
        command = BY_NAME[frame.type]
        if command.authorize is not None:
            command.authorize(self.principal)
        caller = Caller(
            self.principal,
            self.service,
            self,
            frame.id,
            self.limiter,
            self.token_id,
            origin=self.origin,
        )
        fields = await command.run(caller, frame)
        if fields is not None and command.reply is not None:
            self._answer(command.reply(id=frame.id, **fields).to_bytes())

    # --- subscriptions ------------------------------------------------------------------

    async def subscribe(self, thread_id: str, frame_id: Any, deltas: bool = False) -> None:
        """Listen to a thread: `subscribed`, then the in-flight step's replay, then live frames
        (with `deltas`, invalidations carry the snapshot delta when the gateway builds them)."""
        if thread_id in self._listeners:
            versions = await self.store.thread_versions([thread_id])
            version = versions.get(thread_id, 0)
            self._answer(Subscribed(thread_id=thread_id, version=version, id=frame_id).to_bytes())
            return
        if len(self._listeners) >= self.max_subscriptions:
            self._answer(
                WireError(
                    "too_many_subscriptions",
                    f"at most {self.max_subscriptions} threads per connection",
                ).frame(frame_id)
            )
            return
        # Scope check first (NotFound for a foreign thread): never listen to foreign channels.
        await self.store.thread_version(thread_id, self.principal.scopes)
        listener = ThreadListener(thread_id, self.outbox)
        if deltas and self.deltas is not None and self.deltas.enabled:
            builder = self.deltas
            builder.prime(thread_id, self.principal)
            listener.deltas = lambda thread, version: builder.request(
                thread, version, self.principal, self._viewer()
            )
        self._listeners[thread_id] = listener
        try:
            await self.hub.add(thread_id, listener)
            # Read after listening, so no commit between the two can go unnoticed.
            versions = await self.store.thread_versions([thread_id])
            replay = await self.hub.replay(thread_id)
        except BaseException:
            await self.unsubscribe(thread_id)
            raise
        if self.state is SessionState.CLOSED or self._listeners.get(thread_id) is not listener:
            # Closed meanwhile: close() may have run before the hub registration completed.
            await self.hub.remove(thread_id, listener)
            return
        version = versions.get(thread_id, 0)
        self._answer(Subscribed(thread_id=thread_id, version=version, id=frame_id).to_bytes())
        listener.open(version, replay)
        await self._join(thread_id)

    async def _join(self, thread_id: str) -> None:
        """Be present in the thread (the `presence` frame follows `subscribed` and the replay)."""
        if self.presence is None:
            return

        def deliver(data: bytes) -> None:
            self.outbox.put(data, "presence", thread_id)

        try:
            member = await self.presence.join(thread_id, self.principal, deliver)
        except Exception as exc:  # presence is a nicety: the subscription stands without it
            log.warning("presence join of %s failed: %s", thread_id, exc)
            return
        if self.state is SessionState.CLOSED or thread_id not in self._listeners:
            await self.presence.leave(member)
            return
        self._members[thread_id] = member

    async def update_presence(self, thread_id: str, changes: dict[str, Any]) -> None:
        """A `presence.update` of a subscribed thread (coalesced and rate-bounded)."""
        member = self._members.get(thread_id)
        if member is None or self.presence is None:
            # As for a foreign thread: a connection is present only where it subscribed.
            raise NotFound(f"thread {thread_id} not found among this connection's subscriptions")
        self.presence.update(member, changes)

    async def unsubscribe(self, thread_id: str) -> None:
        """Stop listening to a thread (nothing happens for one not listened to)."""
        listener = self._listeners.pop(thread_id, None)
        if listener is None:
            return
        listener.closed = True
        self.outbox.discard_thread(thread_id)
        member = self._members.pop(thread_id, None)
        if member is not None and self.presence is not None:
            await self.presence.leave(member)
        try:
            await self.hub.remove(thread_id, listener)
        except Exception:
            log.exception("hub.remove(%s) failed", thread_id)

    async def close(self) -> None:
        """Stop listening to every thread. Runs are unaffected: closing a tab stops nothing."""
        if self.state is SessionState.CLOSED:
            return
        self.state = SessionState.CLOSED
        for thread_id in list(self._listeners):
            await self.unsubscribe(thread_id)
        await self.unsubscribe_actions(None)

    # --- the scope-wide action inbox ----------------------------------------------------

    def _inbox_scopes(self, scope: str | None) -> list[str]:
        if scope is None:
            return sorted(self.principal.scopes)
        if scope not in self.principal.scopes:
            raise NotFound(f"scope {scope} not found")  # as for threads: never confirm it
        return [scope]

    async def subscribe_actions(
        self,
        scope: str | None,
        assigned: bool = False,
        allowed: tuple[ThreadMatch, ...] | None = None,
    ) -> list[str]:
        """Listen to the pending actions of one scope of the token's (None: all of them); with
        `assigned`, to those this principal may decide now (`assigned_frame`); of the threads
        matching `allowed` when the authorization hook narrowed the caller."""
        if self.inbox is None:
            raise InvalidInput("this server has no action inbox")
        scopes = self._inbox_scopes(scope)
        for name in scopes:
            if name in self._inbox_listeners:
                continue
            key = f"actions:{name}"

            def deliver(data: bytes, key: str = key) -> None:
                if assigned:
                    data = assigned_frame(self.principal, data)
                self.outbox.put(data, "action", key)

            self._inbox_listeners[name] = deliver
            try:
                await self.inbox.add(name, deliver, allowed)
            except BaseException:
                await self.unsubscribe_actions(name)
                raise
        if self.state is SessionState.CLOSED:
            await self.unsubscribe_actions(None)
        return scopes

    async def unsubscribe_actions(self, scope: str | None) -> list[str]:
        scopes = sorted(self._inbox_listeners) if scope is None else self._inbox_scopes(scope)
        for name in scopes:
            deliver = self._inbox_listeners.pop(name, None)
            if deliver is not None and self.inbox is not None:
                try:
                    await self.inbox.remove(name, deliver)
                except Exception:
                    log.exception("inbox.remove(%s) failed", name)
        return scopes

    # --- the connection's token ------------------------------------------------------------

    async def refresh_token(self, token: str) -> Grant:
        """Run on `token` from now on (`auth.refresh`): authenticated as a connect token is, and
        naming the same holder; a refusal raises and leaves the connection as it was."""
        if self.grant is None:
            raise InvalidInput("this connection cannot refresh its token")
        fresh = await grant(self.service.store, token)
        self.grant.check_successor(fresh)
        self.grant = fresh
        self.principal = fresh.principal
        self.token_id = token_key_of_hash(fresh.token_hash)
        if self.origin is not None:
            self.origin = self.origin.model_copy(update={"token_id": self.token_id})
        if self.on_refresh is not None:
            self.on_refresh(fresh)
        return fresh

    # --- output -------------------------------------------------------------------------

    def _answer(self, data: bytes) -> None:
        self.outbox.put(data, ANSWER, "")


def assigned_frame(principal: Principal, data: bytes) -> bytes:
    """An inbox frame as an `assigned=me` subscriber sees it: an action it may not decide
    (any more: it decided, or another stage is waited for) is `action.resolved` for it, so a
    decision takes the action out of every inbox it leaves at once."""
    frame = orjson.loads(data)
    action = frame.get("action")
    if frame.get("type") != "action.pending" or not isinstance(action, dict):
        return data
    if wire_refusal(principal, action) is None:
        return data
    left = {k: frame[k] for k in ("scope", "thread_id", "version") if k in frame}
    return orjson.dumps({"type": "action.resolved", **left, "action_id": action.get("id")})
