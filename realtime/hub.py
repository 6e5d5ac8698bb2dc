"""Per-process fan-out of thread channels to local listeners, with version polling as fallback."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias, runtime_checkable

import orjson

from realtime.bus import Bus
from realtime.bus_errors import BusError
from realtime.bus_support import AsyncResource, cancel_and_wait
from realtime.channels import replay_key, thread_channel
from realtime.envelopes import (
    ChunkPosition,
    InvalidateEnvelope,
    MessageKind,
    ResyncEnvelope,
    chunk_position,
    encode,
)

log = logging.getLogger(__name__)

VersionSource: TypeAlias = Callable[[Sequence[str]], Awaitable[Mapping[str, int]]]
DeliverFn: TypeAlias = Callable[[bytes, MessageKind, "int | None"], None]


@dataclass(frozen=True)
class Freshness:
    """What a gateway knows of a watched thread's committed state right now: the live watch
    (`watch`, an identity), its resync `epoch` and the newest version announced (None: none
    since the subscription was established). Something read at version v while these held is
    current for this gateway as long as `Hub.freshness` returns the same watch and epoch and a
    version of at most v."""

    watch: object
    epoch: int
    version: int | None

    def covers(self, read_with: Freshness, version: int) -> bool:
        """Whether a read made at `version` under `read_with` is still as new as this knows."""
        return (
            self.watch is read_with.watch
            and self.epoch == read_with.epoch
            and (self.version is None or version >= self.version)
        )


@runtime_checkable
class Listener(Protocol):
    """A local receiver (typically one connection's outbox for one thread).

    `deliver` is called synchronously from the hub's task with the very bytes object every other
    listener gets; it must not block (queue and return). `kind` and `version` come from the one
    parse the hub did, so listeners never parse: `version` is set for invalidations only.
    """

    def deliver(self, data: bytes, kind: MessageKind, version: int | None) -> None: ...


ListenerLike: TypeAlias = Listener | DeliverFn


@dataclass(eq=False)
class _Watch:
    thread_id: str
    ready: asyncio.Future[None]
    listeners: list[tuple[ListenerLike, DeliverFn]] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    version: int | None = None  # newest invalidation seen (live or polled)
    dropped: int = 0
    epoch: int = 0  # resyncs so far: what was derived from earlier invalidations may be stale


MAX_TRACKED_RUNS = 4096


class NewestEpisodes:
    """The newest episode seen per run, for the most recently active `limit` runs.

    It outlives any thread's listeners: a takeover seen while someone listened still voids the
    stale worker's chunks for whoever subscribes after the last listener left.
    """

    def __init__(self, limit: int = MAX_TRACKED_RUNS) -> None:
        self._limit = limit
        self._newest: OrderedDict[str, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._newest)

    def superseded(self, position: ChunkPosition) -> bool:
        """Whether a live chunk comes from an episode older than one already seen for its run."""
        newest = self._newest.get(position.run_id)
        if newest is None or position.episode > newest:
            self._newest[position.run_id] = position.episode
            while len(self._newest) > self._limit:
                self._newest.popitem(last=False)
        self._newest.move_to_end(position.run_id)
        return newest is not None and position.episode < newest


def _classify(data: bytes) -> tuple[MessageKind, int | None, ChunkPosition | None] | None:
    try:
        message = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(message, dict):
        return None
    kind = message.get("type")
    if kind == "chunk":
        try:
            position = ChunkPosition(
                str(message["run_id"]), int(message.get("episode", 0)), int(message["seq"])
            )
        except (KeyError, TypeError, ValueError):
            return None
        return "chunk", None, position
    if kind == "invalidate":
        version = message.get("version")
        if isinstance(version, int) and not isinstance(version, bool):
            return "invalidate", version, None
    return None


def current_episodes(replay: list[bytes]) -> list[bytes]:
    """A replay buffer without the chunks of episodes a newer one of the same run replaced."""
    positions = [chunk_position(data) for data in replay]
    newest: dict[str, int] = {}
    for position in positions:
        if position is not None:
            newest[position.run_id] = max(newest.get(position.run_id, 0), position.episode)
    return [
        data
        for data, position in zip(replay, positions, strict=True)
        if position is not None and position.episode == newest[position.run_id]
    ]


class Hub(AsyncResource):
    """One bus subscription per watched thread, shared by every local listener of that thread.

    While the bus is unhealthy, and once right after it reconnects, the hub asks
    `version_source` (thread ids -> committed versions) for the watched threads every
    `poll_interval` seconds and delivers a synthetic invalidation when a thread moved past the
    newest version the hub has seen, so clients converge without the bus. After a reconnect, or
    when the bus dropped messages for a slow hub, listeners get a `resync` message
    (`{"type": "resync", "thread_id"}`): live chunks may be missing, refetch the snapshot.
    """

    def __init__(
        self,
        bus: Bus,
        *,
        version_source: VersionSource | None = None,
        poll_interval: float = 1.0,
    ) -> None:
        self._bus = bus
        self._version_source = version_source
        self._poll_interval = poll_interval
        self._watches: dict[str, _Watch] = {}
        self._episodes = NewestEpisodes()
        self._poll_task: asyncio.Task[None] | None = None
        self._poll_wakeup = asyncio.Event()
        self._resync_pending = False
        self._open = False

    @property
    def healthy(self) -> bool:
        return self._bus.healthy

    @property
    def watched_threads(self) -> list[str]:
        return list(self._watches)

    def freshness(self, thread_id: str) -> Freshness | None:
        """The thread's `Freshness`, or None when this hub cannot vouch for it: not watched, its
        subscription not established, the bus unhealthy, or a resync after a reconnect due."""
        watch = self._watches.get(thread_id)
        if watch is None or not self._bus.healthy or self._resync_pending:
            return None
        ready = watch.ready
        if not ready.done() or ready.cancelled() or ready.exception() is not None:
            return None
        return Freshness(watch, watch.epoch, watch.version)

    def listener_count(self, thread_id: str) -> int:
        watch = self._watches.get(thread_id)
        return 0 if watch is None else len(watch.listeners)

    async def open(self) -> None:
        if self._open:
            return
        self._open = True
        self._bus.add_reconnect_listener(self._on_reconnect)
        self._poll_task = asyncio.create_task(self._poll_forever(), name="hub-version-poll")

    async def close(self) -> None:
        """Stop polling and close every bus subscription (the bus itself stays open)."""
        if not self._open:
            return
        self._open = False
        self._bus.remove_reconnect_listener(self._on_reconnect)
        if self._poll_task is not None:
            await cancel_and_wait(self._poll_task)
            self._poll_task = None
        watches, self._watches = list(self._watches.values()), {}
        for watch in watches:
            await self._stop(watch)

    # -- listeners -------------------------------------------------------------------------

    async def add(self, thread_id: str, listener: ListenerLike) -> None:
        """Register `listener`; returns once the thread's bus subscription is established."""
        if not self._open:
            raise RuntimeError("Hub is not open")
        deliver = listener.deliver if isinstance(listener, Listener) else listener
        watch = self._watches.get(thread_id)
        if watch is None:
            watch = _Watch(thread_id, asyncio.get_running_loop().create_future())
            self._watches[thread_id] = watch
            watch.task = asyncio.create_task(self._pump(watch), name=f"hub-{thread_id}")
        watch.listeners.append((listener, deliver))
        try:
            await asyncio.shield(watch.ready)
        except BaseException:
            await self.remove(thread_id, listener)
            raise

    async def remove(self, thread_id: str, listener: ListenerLike) -> None:
        """Unregister one registration of `listener`; the last one closes the subscription."""
        watch = self._watches.get(thread_id)
        if watch is None:
            return
        for index, (registered, _) in enumerate(watch.listeners):
            if registered is listener or registered == listener:
                del watch.listeners[index]
                break
        if not watch.listeners:
            del self._watches[thread_id]
            await self._stop(watch)

    async def replay(self, thread_id: str) -> list[bytes]:
        """The in-flight step's chunk frames, oldest first, without a superseded episode's
        (empty if the bus cannot say)."""
        try:
            frames = current_episodes(await self._bus.read_replay(replay_key(thread_id)))
        except BusError as exc:
            log.warning("replay of thread %s unavailable: %s", thread_id, exc)
            return []
        # A takeover this hub never saw live (published before it subscribed, or during a bus
        # gap) is in the replay its listeners are shown: from now on the superseded worker's
        # live chunks are void here too.
        for data in frames:
            position = chunk_position(data)
            if position is not None:
                self._episodes.superseded(position)
        return frames

    # -- delivery --------------------------------------------------------------------------

    async def _stop(self, watch: _Watch) -> None:
        if not watch.ready.done():
            watch.ready.cancel()
        if watch.task is not None:
            await cancel_and_wait(watch.task)

    async def _pump(self, watch: _Watch) -> None:
        try:
            async with self._bus.subscribe(thread_channel(watch.thread_id)) as subscription:
                if not watch.ready.done():
                    watch.ready.set_result(None)
                async for data in subscription:
                    dropped = subscription.dropped
                    if dropped != watch.dropped:
                        watch.dropped = dropped
                        self._resync(watch)
                    self._dispatch(watch, data)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if watch.ready.done():
                log.exception("hub subscription of thread %s failed", watch.thread_id)
            else:
                watch.ready.set_exception(exc)

    def _dispatch(self, watch: _Watch, data: bytes) -> None:
        classified = _classify(data)
        if classified is None:
            log.warning("dropping unknown message on thread %s: %.80r", watch.thread_id, data)
            return
        kind, version, position = classified
        if position is not None and self._episodes.superseded(position):
            log.info("dropping a superseded episode's chunk on thread %s", watch.thread_id)
            return
        if version is not None:
            if watch.version is not None and version <= watch.version:
                return  # a newer invalidation already went out; only the latest matters
            watch.version = version
        self._fan_out(watch, data, kind, version)

    def _fan_out(self, watch: _Watch, data: bytes, kind: MessageKind, version: int | None) -> None:
        for listener, deliver in tuple(watch.listeners):
            try:
                deliver(data, kind, version)
            except Exception:
                log.exception("hub listener %r failed", listener)

    def _resync(self, watch: _Watch) -> None:
        watch.epoch += 1
        data = encode(ResyncEnvelope(thread_id=watch.thread_id))
        self._fan_out(watch, data, "resync", None)

    # -- resync and version polling --------------------------------------------------------

    def _on_reconnect(self) -> None:
        self._resync_pending = True
        self._poll_wakeup.set()

    async def _poll_forever(self) -> None:
        while True:
            with suppress(TimeoutError):
                async with asyncio.timeout(self._poll_interval):
                    await self._poll_wakeup.wait()
            self._poll_wakeup.clear()
            resync, self._resync_pending = self._resync_pending, False
            if resync:
                for watch in list(self._watches.values()):
                    self._resync(watch)
            if resync or not self._bus.healthy:
                await self.poll_versions()

    async def poll_versions(self) -> None:
        """One version check of every watched thread (the poll loop calls it while needed)."""
        if self._version_source is None or not self._watches:
            return
        try:
            versions = await self._version_source(list(self._watches))
        except Exception as exc:
            log.warning("version poll failed: %s", exc)
            return
        for thread_id, version in versions.items():
            watch = self._watches.get(thread_id)
            if watch is None or (watch.version is not None and version <= watch.version):
                continue
            watch.version = version
            data = encode(InvalidateEnvelope(thread_id=thread_id, version=version))
            self._fan_out(watch, data, "invalidate", version)
