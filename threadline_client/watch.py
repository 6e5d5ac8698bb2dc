"""Live views over one websocket: a thread converging on its committed state, the action inbox."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Self

import orjson
from pydantic import ValidationError
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.typing import Subprotocol

from threadline_client.base import AsyncClosing
from threadline_client.convergence import Refetch, ThreadState
from threadline_client.exceptions import (
    Forbidden,
    NotFound,
    ThreadlineError,
    Unauthorized,
    error_from,
)
from threadline_client.models import PendingAction, Snapshot, typed_chunk
from threadline_client.tokens import keep_fresh
from threadline_wire.chunks import RunTakeoverChunk
from threadline_wire.frames import Subscribed
from threadline_wire.live_frames import LiveFrame, parse_frame
from threadline_wire.presence_frames import PresenceMember
from threadline_wire.snapshot_delta import DeltaMismatch
from threadline_wire.snapshot_delta import apply as apply_delta

if TYPE_CHECKING:
    from threadline_client.client import ThreadlineClient

log = logging.getLogger(__name__)

UNAUTHORIZED_CLOSE = 4401
# Close codes no reconnect can cure with the same token: the watch ends with the typed error.
FATAL_CLOSES: dict[int, tuple[type[ThreadlineError], str, int]] = {
    UNAUTHORIZED_CLOSE: (Unauthorized, "unauthorized", 401),
    4403: (Forbidden, "forbidden", 403),
    4404: (NotFound, "not_found", 404),
}
_FATAL_STATUSES = {status: (kind, code) for kind, code, status in FATAL_CLOSES.values()}


def _fatal(exc: BaseException) -> ThreadlineError | None:
    """The typed error of a connection no reconnect can cure (a refused or revoked token, an
    unknown thread): close codes 4401/4403/4404, or the same refusal as an HTTP status at the
    upgrade; None for a connection worth opening again."""
    if isinstance(exc, ConnectionClosed) and exc.rcvd is not None:
        known = FATAL_CLOSES.get(exc.rcvd.code)
        if known is not None:
            kind, code, status = known
            return kind(code, exc.rcvd.reason or f"closed {exc.rcvd.code}", status)
    if isinstance(exc, InvalidStatus):
        refused = _FATAL_STATUSES.get(exc.response.status_code)
        if refused is not None:
            kind, code = refused
            return kind(
                code, f"upgrade refused: {exc.response.status_code}", exc.response.status_code
            )
    return None


# Events waiting for a slow consumer; the state itself is never behind, only the event log.
MAX_EVENTS = 10_000

EventKind = Literal[
    "snapshot",
    "chunk",
    "invalidate",
    "resync",
    "takeover",
    "connected",
    "disconnected",
    "pending",
    "resolved",
    "synced",
    "frame",
    "presence",
    "changed",
]


@dataclass
class Backoff:
    """Reconnect delays: exponential from `initial` to `maximum`, with jitter; `reset()` after
    a connection that worked."""

    initial: float = 0.1
    maximum: float = 5.0
    factor: float = 2.0
    _current: float = 0.0

    def next(self) -> float:
        self._current = (
            self.initial if not self._current else min(self.maximum, self._current * self.factor)
        )
        return self._current * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        self._current = 0.0


@dataclass(frozen=True)
class WatchEvent:
    """One thing that happened: `kind`, the frame it came from (if any), and what it carried
    (`chunk` and `takeover`: the chunk, a `threadline_wire.chunks` model)."""

    kind: EventKind
    # The frame as its `threadline_wire.live_frames` model (`ChunkFrame`, `PresenceSet`,
    # `ActionPendingFrame`, ...; a newer server's unknown frame: an `OtherFrame`).
    frame: LiveFrame | None = None
    data: Any = None


@dataclass
class _Socket:
    """One websocket connection's request/answer bookkeeping."""

    ws: ClientConnection
    answers: dict[str, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)
    ids: Any = field(default_factory=itertools.count)

    async def request(self, frame: dict[str, Any], timeout: float) -> dict[str, Any]:
        frame_id = f"py-{next(self.ids)}"
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.answers[frame_id] = future
        try:
            await self.ws.send(orjson.dumps({**frame, "id": frame_id}).decode())
            async with asyncio.timeout(timeout):
                return await future
        finally:
            self.answers.pop(frame_id, None)

    def answer(self, frame: dict[str, Any]) -> bool:
        future = self.answers.get(frame.get("id"))  # type: ignore[arg-type]
        if future is None or future.done():
            return False
        future.set_result(frame)
        return True


class _LiveView(AsyncClosing):
    """Reconnecting websocket loop shared by the thread watch and the actions watch."""

    def __init__(self, client: ThreadlineClient, backoff: Backoff | None) -> None:
        self.client = client
        self.backoff = backoff or Backoff()
        self.connections = 0
        self._events: deque[WatchEvent] = deque(maxlen=MAX_EVENTS)
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._closed = False
        self._socket: _Socket | None = None
        # The last connection was closed at its token's expiry: open the next with a new one.
        self._expired = False

    def _enter(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"threadline-{type(self).__name__}")

    async def aclose(self) -> None:
        self._closed = True
        tasks = [t for t in (self._task, *self._helpers()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._changed.set()

    # --- consuming -------------------------------------------------------------------------

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> WatchEvent:
        while not self._events:
            self._raise_failure()
            if self._closed:
                raise StopAsyncIteration
            self._changed.clear()
            await self._changed.wait()
        return self._events.popleft()

    async def until(self, predicate: Callable[[Self], bool], timeout: float = 30.0) -> Self:
        """Wait until `predicate(self)` holds (checked on every change); returns self."""
        async with asyncio.timeout(timeout):
            while not predicate(self):
                self._raise_failure()
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await self._changed.wait()
        return self

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _emit(self, kind: EventKind, frame: dict[str, Any] | None = None, data: Any = None) -> None:
        typed = None if frame is None else parse_frame(frame)
        self._events.append(WatchEvent(kind, typed, data))
        self._changed.set()

    # --- the connection loop ---------------------------------------------------------------

    async def _run(self) -> None:
        try:
            # Started by `_enter`, so never closed before its first connection; `aclose` sets
            # `_closed` and then cancels this task, so only the end of a connection can find it
            # closed (the check that made it `while not self._closed` could never fail).
            while True:
                try:
                    await self._connection()
                except (OSError, ConnectionClosed, TimeoutError, InvalidStatus) as exc:
                    fatal = self._final(exc)
                    if fatal is not None:
                        raise fatal from exc
                    log.info("threadline websocket lost (%s); reconnecting", exc)
                if self._closed:
                    return
                self._emit("disconnected")
                await asyncio.sleep(self.backoff.next())
        except ThreadlineError as exc:
            self._failure = exc
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug or an unexpected answer: surface it to the consumer
            self._failure = exc
        finally:
            self._socket = None
            self._changed.set()

    def _final(self, exc: BaseException) -> ThreadlineError | None:
        """`_fatal`, except for an expiry the token provider can cure."""
        return None if self._expired_with_provider(exc) else _fatal(exc)

    def _expired_with_provider(self, exc: BaseException) -> bool:
        """Closed at the token's expiry (4403 "token expired") while a provider can give the
        next token: worth reconnecting with it (a refresh failed or came too late)."""
        rcvd = exc.rcvd if isinstance(exc, ConnectionClosed) else None
        expired = rcvd is not None and (rcvd.code, rcvd.reason) == (4403, "token expired")
        self._expired = expired and self.client.tokens.refreshable
        return self._expired

    async def _connection(self) -> None:
        token = await self.client.bearer(fresh=self._expired)
        self._expired = False
        # The token goes as a subprotocol, not in the URL (which proxies and logs keep); the
        # server answers `threadline.v1` (docs/protocol.md, "Authentication").
        subprotocols = [Subprotocol("threadline.v1"), Subprotocol(f"bearer.{token}")]
        async with connect(
            self.client.ws_url,
            subprotocols=subprotocols,
            open_timeout=10,
            close_timeout=2,
            max_size=2**24,
        ) as ws:
            socket = _Socket(ws)
            self._socket = socket
            reader = asyncio.create_task(self._read(socket), name="threadline-ws-reader")
            keeper: asyncio.Task[None] | None = None
            try:
                await self._on_open(socket)
                self.connections += 1
                self.backoff.reset()
                self._emit("connected")
                if self.client.tokens.refreshable:
                    keeper = asyncio.create_task(
                        self._keep_token(socket, token), name="threadline-ws-token"
                    )
                await reader
            finally:
                for task in (reader, keeper):
                    if task is not None:
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError, Exception):
                            await task
                self._socket = None

    async def _keep_token(self, socket: _Socket, token: str) -> None:
        async def refresh(token: str) -> dict[str, Any] | None:
            try:
                return await self._request(socket, {"type": "auth.refresh", "token": token})
            except ThreadlineError as exc:
                log.warning("the server refused the refreshed token: %s", exc)
                return None

        await keep_fresh(token, refresh, lambda: self.client.bearer(fresh=True), self.client.tokens)

    async def _read(self, socket: _Socket) -> None:
        try:
            async for message in socket.ws:
                frame = orjson.loads(message)
                if isinstance(frame, dict) and not socket.answer(frame):
                    self._on_frame(frame)
        except ConnectionClosed as exc:
            # A request in flight (the subscribe of `_on_open`) learns of the close at once,
            # with the typed error when it is final, instead of waiting out its timeout.
            error: BaseException = self._final(exc) or exc
            for future in socket.answers.values():
                if not future.done():
                    future.set_exception(error)
            if error is exc:
                raise
            raise error from exc

    async def _request(self, socket: _Socket, frame: dict[str, Any]) -> dict[str, Any]:
        answer = await socket.request(frame, timeout=self.client.http.timeout.read or 10.0)
        if answer.get("type") == "error":
            envelope = ("type", "code", "message", "id")
            details = {k: v for k, v in answer.items() if k not in envelope}
            raise error_from(str(answer.get("code")), str(answer.get("message")), 0, details)
        return answer

    # --- hooks -----------------------------------------------------------------------------

    def _helpers(self) -> tuple[asyncio.Task[None] | None, ...]:
        return ()

    async def _on_open(self, socket: _Socket) -> None:
        raise NotImplementedError

    def _on_frame(self, frame: dict[str, Any]) -> None:
        raise NotImplementedError


class ThreadWatch(_LiveView):
    """One thread, converged as a browser tab converges it (`threadline_client.convergence`).

    Iterate for events (`snapshot`, `chunk`, `invalidate`, `resync`, `takeover`, `connected`,
    `disconnected`); `state` always holds the newest snapshot plus the live chunks on top of it.
    It reconnects with backoff after any connection loss (a gateway restart, a network cut) and
    refetches after every (re)subscription, so it ends on the committed snapshot. A refused
    token or a thread outside the token's scopes ends the iteration with the typed error.
    """

    def __init__(
        self,
        client: ThreadlineClient,
        thread_id: str,
        *,
        backoff: Backoff | None = None,
        deltas: bool = True,
    ) -> None:
        super().__init__(client, backoff)
        self.thread_id = thread_id
        self.state = ThreadState(thread_id)
        # Subscribe with `"deltas": true`: an invalidation whose delta starts at the held
        # version is applied instead of refetched (docs/protocol.md, "Snapshot deltas").
        self.deltas = deltas
        self.deltas_applied = 0
        self._wire: dict[str, Any] | None = None  # the held snapshot as the wire has it
        # Who is here, by subject (`subject`, `role`, `name`, `connections`, `typing`,
        # `reviewing`); replaced by each `presence` frame (after every (re)subscription).
        self.presence: dict[str, PresenceMember] = {}
        self.fetches = 0
        self._fetcher: asyncio.Task[None] | None = None
        self._again = False
        self._force = False

    @property
    def snapshot(self) -> Snapshot | None:
        return self.state.snapshot

    @property
    def settled(self) -> bool:
        """A snapshot is in, and no refetch is running or owed: `state` reflects every
        announcement seen so far (False before the first snapshot, so `w.settled and
        w.snapshot...` never reads a snapshot that is not there)."""
        return (
            self.state.snapshot is not None
            and self._fetcher is None
            and not self.state.wants_more()
        )

    def _helpers(self) -> tuple[asyncio.Task[None] | None, ...]:
        return (self._fetcher,)

    async def _on_open(self, socket: _Socket) -> None:
        subscribe: dict[str, Any] = {"type": "subscribe", "thread_id": self.thread_id}
        if self.deltas:
            subscribe["deltas"] = True
        answer = await self._request(socket, subscribe)
        self._trigger(self.state.subscribed(Subscribed.model_validate(answer).version))

    def _on_frame(self, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        if frame.get("thread_id") != self.thread_id:
            return
        if kind == "chunk":
            refetch = self.state.chunk(frame)
            chunk = typed_chunk(frame.get("chunk") or {})
            takeover = isinstance(chunk, RunTakeoverChunk)
            self._emit("takeover" if takeover else "chunk", frame, chunk)
            self._trigger(refetch)
        elif kind == "invalidate":
            self._emit("invalidate", frame, frame.get("version"))
            if not self._apply_delta(frame):
                self._trigger(self.state.invalidate(int(frame.get("version", 0))))
        elif kind == "resync":
            self._emit("resync", frame)
            self._trigger(self.state.resync())
        elif kind == "presence":
            members = [_member(m) for m in frame.get("members") or []]
            self.presence = {m.subject: m for m in members if m is not None}
            self._emit("presence", frame, self.presence)
        elif kind in ("presence.join", "presence.update"):
            member = _member(frame.get("member"))
            if member is not None:
                self.presence[member.subject] = member
            self._emit("presence", frame, self.presence)
        elif kind == "presence.leave":
            self.presence.pop(str(frame.get("subject")), None)
            self._emit("presence", frame, self.presence)
        elif kind == "error":
            self._emit("frame", frame)

    def _apply_delta(self, frame: dict[str, Any]) -> bool:
        """Hold the snapshot an invalidation's delta makes of the held one, when it starts at
        the held version; False (refetch as usual) for any other."""
        delta, wire = frame.get("delta"), self._wire
        if not isinstance(delta, dict) or wire is None or delta.get("from") != self.state.version:
            return False
        try:
            new = apply_delta(wire, {k: v for k, v in delta.items() if k != "etag"})
            snapshot = Snapshot.model_validate(new)
        except (DeltaMismatch, ValidationError) as exc:
            log.info("delta of %s not applied (%s); refetching", self.thread_id, exc)
            return False
        if snapshot.thread.version != frame.get("version"):
            return False
        if self.state.apply_snapshot(snapshot, self.state.ordinal):
            self._wire = new
            self.deltas_applied += 1
            self._emit("snapshot", None, snapshot)
        self._changed.set()
        return True

    async def set_presence(self, **changes: Any) -> None:
        """Say what this connection does in the thread: `typing=True`, `reviewing=action_id`
        (None clears it). Sent on the current connection; lost if it is down (presence is
        live state, and a reconnect starts afresh)."""
        socket = self._socket
        if socket is None:
            return
        frame = {"type": "presence.update", "thread_id": self.thread_id, **changes}
        await self._request(socket, frame)

    def _trigger(self, refetch: Refetch | None) -> None:
        if refetch is None or self._closed:
            return
        self._force = self._force or refetch.force
        if self._fetcher is not None:
            self._again = True
            return
        self._fetcher = asyncio.create_task(self._fetch_loop(), name="threadline-refetch")

    async def _fetch_loop(self) -> None:
        from threadline_client.exceptions import NotFound

        try:
            backoff = Backoff(initial=0.2, maximum=5.0)
            while not self._closed:
                self._again, self._force = False, False
                ordinal = self.state.ordinal
                try:
                    snapshot, wire = await self.client.snapshot_with_wire(self.thread_id)
                except (NotFound, Unauthorized) as exc:
                    self._failure = exc
                    return
                except Exception as exc:  # storage or network hiccup: the snapshot is still owed
                    log.info("snapshot of %s failed (%s); retrying", self.thread_id, exc)
                    self._again = True
                    await asyncio.sleep(backoff.next())
                    continue
                backoff.reset()
                self.fetches += 1
                if self.state.apply_snapshot(snapshot, ordinal):
                    self._wire = wire
                    self._emit("snapshot", None, snapshot)
                if not (self._again and (self._force or self.state.wants_more())):
                    return
        finally:
            self._fetcher = None
            self._changed.set()


def _member(entry: Any) -> PresenceMember | None:
    """A presence entry as its model; None for one that is not (skipped, never a crash)."""
    try:
        return PresenceMember.model_validate(entry)
    except ValidationError:
        return None


class ActionsWatch(_LiveView):
    """The scope-wide pending-action inbox, live (`actions.subscribe`).

    `actions` holds every pending action of the token's scopes by id. The list is fetched
    (`GET /v1/actions?status=pending`) after every (re)subscription and `actions.resync`; live
    `action.pending` / `action.resolved` frames apply on top when they carry a thread version
    newer than the one the held entry came from. Events: `synced` (the list was refetched),
    `pending` (data: the PendingAction), `changed` (data: the PendingAction, its progress
    moved), `resolved` (data: the action id), `connected`, `disconnected`. With
    `assigned="me"` it holds only the actions this caller may decide now.
    """

    def __init__(
        self,
        client: ThreadlineClient,
        *,
        backoff: Backoff | None = None,
        assigned: Literal["me"] | None = None,
    ) -> None:
        super().__init__(client, backoff)
        self.assigned = assigned
        self.actions: dict[str, PendingAction] = {}
        self.versions: dict[str, int] = {}  # thread id -> the version our entries come from
        self.scopes: list[str] = []
        self.syncs = 0
        self._fetcher: asyncio.Task[None] | None = None
        self._again = False
        self._during_fetch: list[dict[str, Any]] | None = None

    def _helpers(self) -> tuple[asyncio.Task[None] | None, ...]:
        return (self._fetcher,)

    async def _on_open(self, socket: _Socket) -> None:
        subscribe: dict[str, Any] = {"type": "actions.subscribe"}
        if self.assigned is not None:
            subscribe["assigned"] = self.assigned
        answer = await self._request(socket, subscribe)
        self.scopes = list(answer.get("scopes", []))
        self._refetch()

    def _on_frame(self, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        if kind in ("action.pending", "action.resolved"):
            if self._during_fetch is not None:
                self._during_fetch.append(frame)
            self._apply(frame)
        elif kind == "actions.resync":
            self._refetch()

    def _apply(self, frame: dict[str, Any]) -> None:
        thread_id, version = str(frame.get("thread_id")), int(frame.get("version", 0))
        if version < self.versions.get(thread_id, -1):
            return
        self.versions[thread_id] = version
        if frame["type"] == "action.pending":
            action = PendingAction.model_validate(
                {**frame["action"], "thread_id": thread_id, "scope": frame.get("scope")}
            )
            held = self.actions.get(action.id)
            self.actions[action.id] = action
            if held is None:
                self._emit("pending", frame, action)
            elif held != action:
                self._emit("changed", frame, action)
        else:
            action_id = str(frame.get("action_id"))
            if self.actions.pop(action_id, None) is not None:
                self._emit("resolved", frame, action_id)

    def _refetch(self) -> None:
        if self._fetcher is not None:
            self._again = True
            return
        self._fetcher = asyncio.create_task(self._fetch_loop(), name="threadline-inbox")

    async def _fetch_loop(self) -> None:
        try:
            backoff = Backoff(initial=0.2, maximum=5.0)
            while not self._closed:
                self._again = False
                self._during_fetch = []
                try:
                    listed = [a async for a in self.client.pending(assigned=self.assigned)]
                except Unauthorized as exc:
                    self._failure = exc
                    return
                except Exception as exc:
                    log.info("inbox refetch failed (%s); retrying", exc)
                    await asyncio.sleep(backoff.next())
                    self._again = True
                    continue
                during, self._during_fetch = self._during_fetch, None
                self.actions = {action.id: action for action in listed}
                self.versions = {
                    a.thread_id: int(getattr(a, "thread_version", 0) or 0)
                    for a in listed
                    if a.thread_id is not None
                }
                for frame in during:  # announced after the list may have been read
                    self._apply(frame)
                self.syncs += 1
                self._emit("synced", None, list(self.actions.values()))
                if not self._again:
                    return
        finally:
            self._during_fetch = None
            self._fetcher = None
            self._changed.set()
