"""One thread as an event source for HTTP streams: snapshot, then the replay, then live chunks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import anyio
import orjson
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import StreamingResponse

from realtime.bus_metrics import safe_add
from realtime.envelopes import MessageKind
from runtime.domain import RunStatus, Snapshot
from runtime.errors import Unavailable
from runtime.service.client_threads import ClientThread
from server.live.quotas import REFRESH_INTERVAL, ConnectionSlot
from server.protocol.command_model import Caller, Step
from server.protocol.commands import BY_NAME
from server.protocol.inputs import GetSnapshot
from server.tracing import SSE_STREAMS

log = logging.getLogger(__name__)


class ServerDraining(Unavailable):
    """This gateway is shutting down: a stream's final event (code `unavailable`)."""


# Bounded: a stream that cannot keep up resynchronises from the snapshot instead of growing.
MAX_QUEUED = 4096
# Without any traffic, re-read the snapshot this often: a lost invalidation never hangs a stream.
IDLE_POLL_SECONDS = 2.0
TAKEOVER = "run-takeover"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class Listening(Protocol):
    """The hub (realtime.hub.Hub) as a stream uses it: the same calls a websocket session makes."""

    async def add(self, thread_id: str, listener: Any) -> None: ...
    async def remove(self, thread_id: str, listener: Any) -> None: ...
    async def replay(self, thread_id: str) -> list[bytes]: ...


@dataclass(frozen=True)
class Committed:
    """Committed state. `reset`: chunks restart at the run's `next_seq` (what streamed is void)."""

    snapshot: Snapshot
    reset: bool


@dataclass(frozen=True)
class Chunk:
    """A canonical chunk (already redacted by the run's transform) of `run_id`, in seq order."""

    run_id: str
    seq: int
    chunk: dict[str, Any]


Event = Committed | Chunk


def is_settled(snapshot: Snapshot, run_id: str) -> bool:
    """`run_id` needs nothing more from a stream: ended, waiting, or already followed by another."""
    run = snapshot.run
    if run is None or run.id != run_id:
        return True
    return run.status is RunStatus.WAITING or run.status.is_terminal


@dataclass(eq=False)
class ThreadFeed:
    """Listens to one thread through the hub and yields its events, fenced by (run, seq).

    Open it (`async with`) before acting on the thread, so nothing the action causes can be
    missed; `events()` then yields the committed snapshot, the in-flight step's chunks from the
    replay buffer, and live chunks, each chunk once and in order. A gap, a hub resync or an
    overflow re-reads the snapshot and the replay (`Committed(reset=True)`).

    An open feed holds a connection slot of its caller's token and subject, the budget its
    websockets draw from too (docs/operations.md, "Connection caps"), refreshed while it lives.
    """

    caller: Caller
    hub: Listening
    thread_id: str
    # Bus messages, and "shutdown" from the server's drain.
    _queue: asyncio.Queue[tuple[bytes, MessageKind | Literal["shutdown"]]] = field(
        default_factory=asyncio.Queue
    )
    _overflow: bool = False
    _listening: bool = False
    _slot: ConnectionSlot | None = None
    _refreshed: float = 0.0
    _stopping: bool = False
    _voided: bool = False  # the last resync came from a takeover
    # A stream that cannot take back what it sent (the AI SDK's): a resync does not re-send
    # the in-flight step's chunks it already sent. AG-UI replaces the partial message instead.
    append_only: bool = False

    def shutdown(self) -> None:
        """The server is shutting down: the stream ends with ServerDraining (server/drain.py)."""
        self._stopping = True  # the queue may be cleared (resync) before the marker is read
        self._queue.put_nowait((b"", "shutdown"))

    def deliver(self, data: bytes, kind: MessageKind, version: int | None) -> None:
        if self._queue.qsize() >= MAX_QUEUED:
            self._overflow = True
            return
        self._queue.put_nowait((data, kind))

    async def __aenter__(self) -> ThreadFeed:
        if self._listening:
            return self  # entered before the response started; the stream's `with` is a no-op
        limiter = self.caller.limiter
        if limiter is not None:
            # Refused with `too_many_connections` before it listens to anything.
            self._slot = await limiter.connect(self.caller.principal, self.caller.token_id)
            self._refreshed = time.monotonic()
        await self.hub.add(self.thread_id, self)
        self._listening = True
        return self

    async def __aexit__(self, *exc: object) -> None:
        # Shielded: a client that goes away cancels the response's task, and a release cut at
        # its first await (a Redis round trip) would hold the slot until it expires.
        with anyio.CancelScope(shield=True):
            if self._listening:
                self._listening = False
                await self.hub.remove(self.thread_id, self)
            slot, self._slot = self._slot, None
            if slot is not None and self.caller.limiter is not None:
                await self.caller.limiter.disconnect(slot)

    async def _keep_slot(self) -> None:
        if self._slot is None or self.caller.limiter is None:
            return
        if time.monotonic() - self._refreshed >= REFRESH_INTERVAL:
            self._refreshed = time.monotonic()
            await self.caller.limiter.keep(self._slot)

    async def snapshot(self) -> Snapshot:
        """The committed thread, through the table's read (the one HTTP's snapshot route runs)."""
        read = BY_NAME["thread.snapshot"]
        snapshot: Snapshot = await read.result(self.caller, GetSnapshot(thread_id=self.thread_id))
        return snapshot

    async def events(self) -> AsyncIterator[Event]:
        expected: dict[str, int] = {}
        version = -1
        reset = False
        retried = False
        while True:
            # (Re)synchronise: committed state first, then the in-flight step it does not hold.
            # An append-only stream does not get again what it was sent of the same episode;
            # after a takeover the new worker's seqs repeat and are streamed.
            sent = dict(expected) if self.append_only and not self._voided else {}
            self._voided = False
            snapshot = await self.snapshot()
            version = snapshot.thread.version
            expected.clear()
            if snapshot.run is not None:
                expected[snapshot.run.id] = snapshot.run.next_seq
            yield Committed(snapshot, reset)
            reset = True
            gap = False
            replay = after_takeover(
                [_chunk(data) for data in await self.hub.replay(self.thread_id)]
            )
            # The replay starts at its last takeover, if it holds one: the new worker's seqs.
            if not (replay and replay[0].chunk.get("type") == TAKEOVER):
                for run_id, seq in sent.items():
                    if run_id in expected:
                        expected[run_id] = max(expected[run_id], seq)
            for chunk in replay:
                verdict = _admit(expected, chunk)
                if verdict == "gap" and not retried:
                    # Most likely a commit between the two reads: read both again, once. A
                    # replay buffer trimmed to its limit keeps its gap: streaming goes on, and
                    # the run's closing snapshot holds what was skipped.
                    gap = True
                    break
                if verdict != "old":
                    expected[chunk.run_id] = chunk.seq + 1
                    yield chunk
            retried = gap
            if gap:
                continue
            async for event in self._live(expected, version):
                if event is None:
                    break  # resynchronise
                if isinstance(event, Committed):
                    version = event.snapshot.thread.version
                yield event

    async def _live(self, expected: dict[str, int], version: int) -> AsyncIterator[Event | None]:
        while True:
            await self._keep_slot()
            if self._overflow:
                self._overflow = False
                self._drain()
                yield None
                return
            try:
                async with asyncio.timeout(IDLE_POLL_SECONDS):
                    data, kind = await self._queue.get()
            except TimeoutError:
                data, kind = b"", "invalidate"
            if kind == "resync":
                self._drain()
                yield None
                return
            if kind == "shutdown" or self._stopping:
                raise ServerDraining(
                    "the server is shutting down; the run goes on: reconnect to follow it"
                )
            if kind == "invalidate":
                snapshot = await self.snapshot()
                if snapshot.thread.version != version:
                    # `expected` stays: this snapshot may be newer than the invalidation (read
                    # later), and the chunks of a step it already holds may still be queued
                    # behind: they are streamed, not skipped (an AI SDK stream never re-sends
                    # a committed step). Chunks truly lost show as a gap, and resynchronise.
                    version = snapshot.thread.version
                    yield Committed(snapshot, False)
                continue
            chunk = _chunk(data)
            if chunk is None:
                continue
            if chunk.chunk.get("type") == TAKEOVER:
                # Another worker redoes the step from its committed start: seqs repeat.
                self._voided = True
                yield None
                return
            verdict = _admit(expected, chunk)
            if verdict == "gap":
                yield None
                return
            if verdict == "new":
                expected[chunk.run_id] = chunk.seq + 1
                yield chunk

    def _drain(self) -> None:
        with contextlib.suppress(asyncio.QueueEmpty):
            while True:
                self._queue.get_nowait()


def after_takeover(chunks: list[Chunk | None]) -> list[Chunk]:
    """The replay from its last takeover on: what a taken-over worker streamed is void."""
    start = 0
    for index, chunk in enumerate(chunks):
        if chunk is not None and chunk.chunk.get("type") == TAKEOVER:
            start = index
    return [chunk for chunk in chunks[start:] if chunk is not None]


def _admit(expected: dict[str, int], chunk: Chunk) -> str:
    """`new` (the next one), `old` (already streamed or committed) or `gap` (some were lost)."""
    want = expected.get(chunk.run_id)
    if want is None:
        # A run that started after the snapshot: its chunks are all live, from its first.
        return "new" if chunk.seq == 0 else "gap"
    if chunk.seq < want:
        return "old"
    return "new" if chunk.seq == want else "gap"


def _chunk(data: bytes) -> Chunk | None:
    try:
        frame = orjson.loads(data)
        return Chunk(str(frame["run_id"]), int(frame["seq"]), dict(frame["chunk"]))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        log.warning("stream: dropping an unreadable chunk frame: %.80r", data)
        return None


# --- HTTP: the set-up every event-stream endpoint shares (AG-UI, AI SDK) -------------------


async def open_thread(caller: Caller, client_id: str, *, create: bool) -> ClientThread:
    """The caller's thread that the client id names (`thread.open`, charged like any command)."""
    command = BY_NAME["thread.open"]
    data = command.parse(caller, {"thread_id": client_id, "create": create})
    opened: ClientThread = await command.result(caller, data)
    return opened


def create_step(caller: Caller, client_id: str, snapshot: Snapshot | None) -> list[Step]:
    """The step creating the client's thread when it does not exist yet (`snapshot` None)."""
    if snapshot is not None:
        return []
    command = BY_NAME["thread.open"]
    return [(command, command.parse(caller, {"thread_id": client_id, "create": True}))]


async def open_feed(
    request: Request,
    caller: Caller,
    thread_id: str,
    create: Sequence[Step] = (),
    charged: Caller | None = None,
    *,
    append_only: bool = False,
) -> ThreadFeed:
    """A feed of `thread_id` already listening (its connection slot taken), then the thread
    created by `create` (steps checked and charged already, run as `charged`): open it before
    applying the request, so nothing the request causes is missed. Hand it to `sse_response`,
    which closes it; close it yourself if you answer otherwise."""
    feed = ThreadFeed(caller, request.app.state.hub, thread_id)
    feed.append_only = append_only
    await feed.__aenter__()
    try:
        for command, data in create:
            await command.result(charged or caller, data)
    except BaseException:
        await feed.__aexit__(None, None, None)
        raise
    drain = getattr(request.app.state, "drain", None)
    if drain is not None:
        drain.track(feed)
    return feed


def sse_response(
    feed: ThreadFeed,
    frames: AsyncIterator[str | bytes],
    *,
    on_error: Callable[[Exception], str | bytes],
    media_type: str = "text/event-stream",
    headers: dict[str, str] | None = None,
    trailer: bytes = b"",
) -> StreamingResponse:
    """Stream `frames` (encoded events); a failure mid-stream becomes `on_error(exc)`'s frame.

    The feed closes when the body ends, and after the response in case the body never started
    (a client gone before the first byte; closing twice is a no-op).
    """

    async def body() -> AsyncIterator[str | bytes]:
        safe_add(SSE_STREAMS, 1)
        try:
            async with feed:
                try:
                    async for frame in frames:
                        yield frame
                except ServerDraining as exc:  # expected: no traceback
                    log.info("event stream of thread %s drained", feed.thread_id)
                    yield on_error(exc)
                except Exception as exc:
                    log.exception("event stream of thread %s failed", feed.thread_id)
                    yield on_error(exc)
            if trailer:
                yield trailer
        finally:
            safe_add(SSE_STREAMS, -1)

    return StreamingResponse(
        body(),
        media_type=media_type,
        headers={**SSE_HEADERS, **(headers or {})},
        background=BackgroundTask(feed.__aexit__, None, None, None),
    )
