"""The scope-wide action inbox, live: per scope one bus subscription, diffs sent to subscribers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from realtime.bus import Bus
from realtime.bus_support import cancel_and_wait_all
from realtime.channels import scope_channel
from runtime.authorization import ThreadMatch, ThreadResource
from runtime.domain import InboxEntry
from runtime.storage.store import ActionStore, ThreadIndex

log = logging.getLogger(__name__)

# A scope's list is read in pages of this many threads when a scope's first subscriber comes
# and after a resync; at most SEED_PAGES pages (a bigger inbox is read by clients over HTTP).
SEED_PAGE = 500
SEED_PAGES = 20
Deliver = Callable[[bytes], None]
# thread id -> (thread version read at, action id -> wire form of the action, the thread)
Known = dict[str, tuple[int, dict[str, dict[str, Any]], ThreadResource]]


class InboxStore(ActionStore, ThreadIndex, Protocol):
    """What the inbox reads: pending actions by scope, and versions of threads left without."""


def entry_actions(entry: InboxEntry) -> dict[str, dict[str, Any]]:
    return {item["id"]: item for item in entry.to_wire()}


def entry_thread(entry: InboxEntry) -> ThreadResource:
    return ThreadResource(entry.thread_id, entry.scope, entry.thread_owner, entry.thread_metadata)


@dataclass(frozen=True, eq=False)
class _Listener:
    """A subscriber, and the threads an authorization hook narrowed it to (None: all)."""

    deliver: Deliver
    allowed: tuple[ThreadMatch, ...] | None = None

    def sees(self, thread: ThreadResource) -> bool:
        if self.allowed is None:
            return True
        return any(match.matches(thread) for match in self.allowed)


def inbox_frames(
    scope: str,
    thread_id: str,
    version: int,
    before: dict[str, dict[str, Any]],
    after: dict[str, dict[str, Any]],
) -> list[dict[str, Any]]:
    """The frames telling a subscriber how a thread's pending actions went from `before` to
    `after` (a pure decision: new ids are pending, vanished ids resolved or withdrawn; an
    action whose progress changed, a partial decision, is sent as pending again)."""
    frames: list[dict[str, Any]] = [
        {
            "type": "action.pending",
            "scope": scope,
            "thread_id": thread_id,
            "version": version,
            "action": action,
        }
        for action_id, action in after.items()
        if action_id not in before or _changed(before[action_id], action)
    ]
    frames += [
        {
            "type": "action.resolved",
            "scope": scope,
            "thread_id": thread_id,
            "version": version,
            "action_id": action_id,
        }
        for action_id in before
        if action_id not in after
    ]
    return frames


def _changed(before: dict[str, Any], after: dict[str, Any]) -> bool:
    # The thread's version moves with any commit; only the action itself counts.
    return {k: v for k, v in before.items() if k != "thread_version"} != {
        k: v for k, v in after.items() if k != "thread_version"
    }


@dataclass(eq=False)
class _Scope:
    scope: str
    listeners: list[_Listener] = field(default_factory=list)
    known: Known = field(default_factory=dict)
    dirty: dict[str, int] = field(default_factory=dict)  # thread id -> announced version
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    refresher: asyncio.Task[None] | None = None
    dropped: int = 0


class ActionInbox:
    """One per gateway process. Subscribers of a scope get `action.pending` and
    `action.resolved` frames, each with the thread `version` it was read at, and
    `actions.resync` when announcements may have been lost (the bus reconnected or dropped
    messages): they then refetch `GET /v1/actions`."""

    def __init__(self, bus: Bus, store: InboxStore) -> None:
        self._bus = bus
        self._store = store
        self._scopes: dict[str, _Scope] = {}
        bus.add_reconnect_listener(self._on_reconnect)

    def listener_count(self, scope: str) -> int:
        watch = self._scopes.get(scope)
        return 0 if watch is None else len(watch.listeners)

    async def add(
        self, scope: str, deliver: Deliver, allowed: tuple[ThreadMatch, ...] | None = None
    ) -> None:
        """Send `deliver` the scope's frames: of the threads matching `allowed` only, when an
        authorization hook narrowed the subscriber (`actions.resync` goes to every one)."""
        watch = self._scopes.get(scope)
        if watch is None:
            watch = _Scope(scope)
            self._scopes[scope] = watch
            watch.task = asyncio.create_task(self._pump(watch), name=f"inbox-{scope}")
            watch.refresher = asyncio.create_task(self._refresh(watch), name=f"inbox-r-{scope}")
        watch.listeners.append(_Listener(deliver, allowed))
        async with asyncio.timeout(10):
            await watch.ready.wait()

    async def remove(self, scope: str, deliver: Deliver) -> None:
        watch = self._scopes.get(scope)
        if watch is None:
            return
        watch.listeners[:] = [lis for lis in watch.listeners if lis.deliver is not deliver]
        if not watch.listeners:
            del self._scopes[scope]
            await self._stop(watch)

    async def close(self) -> None:
        self._bus.remove_reconnect_listener(self._on_reconnect)
        watches, self._scopes = list(self._scopes.values()), {}
        for watch in watches:
            await self._stop(watch)

    async def _stop(self, watch: _Scope) -> None:
        await cancel_and_wait_all((watch.task, watch.refresher))

    # --- the scope's channel ---------------------------------------------------------------

    async def _pump(self, watch: _Scope) -> None:
        try:
            async with self._bus.subscribe(scope_channel(watch.scope)) as subscription:
                # Seed after subscribing: no announcement between the two goes unnoticed.
                watch.known = await self._seed(watch.scope)
                watch.ready.set()
                async for data in subscription:
                    dropped = subscription.dropped
                    if dropped != watch.dropped:
                        watch.dropped = dropped
                        await self._resync(watch)
                    self._announced(watch, data)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("inbox subscription of scope %s failed", watch.scope)
            watch.ready.set()

    def _announced(self, watch: _Scope, data: bytes) -> None:
        try:
            message = orjson.loads(data)
            thread_id, version = str(message["thread_id"]), int(message["version"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            log.warning("dropping unknown message on scope %s: %.80r", watch.scope, data)
            return
        known = watch.known.get(thread_id)
        if known is not None and version <= known[0]:
            return
        watch.dirty[thread_id] = max(version, watch.dirty.get(thread_id, 0))
        watch.wakeup.set()

    async def _refresh(self, watch: _Scope) -> None:
        """Read the announced threads' pending actions (coalesced) and send the differences."""
        while True:
            await watch.wakeup.wait()
            watch.wakeup.clear()
            dirty, watch.dirty = list(watch.dirty), {}
            try:
                entries = await self._store.pending_actions(
                    [watch.scope], limit=len(dirty), thread_ids=dirty
                )
            except Exception as exc:
                log.warning("inbox refresh of scope %s failed: %s", watch.scope, exc)
                await self._resync(watch)
                continue
            found = {entry.thread_id: entry for entry in entries}
            versions = await self._versions(dirty, found)
            for thread_id in dirty:
                entry = found.get(thread_id)
                after = entry_actions(entry) if entry is not None else {}
                version = versions.get(thread_id, 0)
                before_version, before, seen = watch.known.get(thread_id, (-1, {}, None))
                if version <= before_version:
                    continue
                # The thread as read now; a thread left without actions as it was last read.
                thread = entry_thread(entry) if entry is not None else seen
                if after and thread is not None:
                    watch.known[thread_id] = (version, after, thread)
                else:
                    watch.known.pop(thread_id, None)
                for frame in inbox_frames(watch.scope, thread_id, version, before, after):
                    self._fan_out(watch, orjson.dumps(frame), thread)

    async def _versions(self, dirty: list[str], found: dict[str, InboxEntry]) -> dict[str, int]:
        versions = {thread_id: entry.thread_version for thread_id, entry in found.items()}
        missing = [thread_id for thread_id in dirty if thread_id not in versions]
        if missing:
            versions.update(await self._store.thread_versions(missing))
        return versions

    async def _seed(self, scope: str) -> Known:
        known: Known = {}
        after: str | None = None
        for _ in range(SEED_PAGES):
            page = await self._store.pending_actions([scope], limit=SEED_PAGE, after=after)
            for entry in page:
                known[entry.thread_id] = (
                    entry.thread_version,
                    entry_actions(entry),
                    entry_thread(entry),
                )
            if len(page) < SEED_PAGE:
                break
            after = page[-1].thread_id
        return known

    async def _resync(self, watch: _Scope) -> None:
        try:
            watch.known = await self._seed(watch.scope)
        except Exception as exc:
            log.warning("inbox reseed of scope %s failed: %s", watch.scope, exc)
        self._fan_out(watch, orjson.dumps({"type": "actions.resync", "scope": watch.scope}))

    def _on_reconnect(self) -> None:
        for watch in list(self._scopes.values()):
            task = asyncio.create_task(self._resync(watch), name=f"inbox-resync-{watch.scope}")
            task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    def _fan_out(self, watch: _Scope, data: bytes, thread: ThreadResource | None = None) -> None:
        """Send `data` to the listeners that see `thread` (None: a frame of no thread's)."""
        for listener in tuple(watch.listeners):
            if thread is not None and not listener.sees(thread):
                continue
            try:
                listener.deliver(data)
            except Exception:
                log.exception("inbox listener failed")
