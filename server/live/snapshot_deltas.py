"""Snapshot deltas: one gateway's `invalidate` frames that carry the change, so a watcher one
version behind needs no refetch (docs/protocol.md, "Snapshot deltas").

For a connection that subscribed with `"deltas": true`, the gateway turns each invalidation of
the thread into the frame `{"type": "invalidate", "thread_id", "version", "delta"}`, where
`delta` (threadline_wire.snapshot_delta) takes the snapshot the viewer held at `delta.from` to
the one it would read at `version`. Both ends of a delta are the committed snapshot as that
viewer sees it (the snapshot cache's read and view, the same as `GET /v1/threads/{id}`
answers), so a delta carries nothing the viewer's own snapshot would not show: one is built per
viewer class (`viewer_key`), never shared between two.

Per thread and viewer class the gateway keeps the newest snapshot it built (the delta's base),
bounded like the cache; builds of one thread and class run in version order, and every
connection of the class shares the one build (one storage read per commit and gateway through
the cache, one view and one diff per class). A delta larger than `max_bytes`, a failed or slow
read, or no base yet: the plain invalidation, and the client refetches as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Any, Protocol

import orjson

from realtime.envelopes import encode_invalidate
from runtime.domain import Principal, Snapshot
from server.live.snapshot_cache import DEFAULT_CAPACITY, ReadKey, SnapshotCache, snapshot_etag
from server.live.snapshot_cache import viewer_key as _viewer_key
from threadline_wire.snapshot_delta import diff

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 16 * 1024
# A build waits this long for its read; then the plain invalidation goes out instead.
READ_TIMEOUT = 2.0

# What a listener gets for an invalidation: the frame's bytes and the version it announces.
Built = tuple[bytes, int]
# (thread, viewer class) -> (version, wire snapshot), least recently kept first.
Bases = OrderedDict[tuple[str, str], tuple[int, dict[str, Any]]]


class SnapshotSource(Protocol):
    """The two reads of `ThreadService` a delta needs: the committed snapshot, then its view."""

    async def committed_snapshot(self, principal: Principal, thread_id: str) -> Snapshot: ...
    async def view_snapshot(self, principal: Principal, committed: Snapshot) -> Snapshot: ...


class SnapshotDeltas:
    """The gateway's delta builder (see the module's docstring)."""

    def __init__(
        self,
        cache: SnapshotCache,
        service: SnapshotSource,
        max_bytes: int = DEFAULT_MAX_BYTES,
        *,
        capacity: int = DEFAULT_CAPACITY,
        read_timeout: float = READ_TIMEOUT,
    ) -> None:
        if max_bytes < 0 or capacity < 1:
            raise ValueError("max_bytes must be at least 0 and capacity at least 1")
        self._cache = cache
        self._service = service
        self.max_bytes = max_bytes
        self._capacity = capacity
        self._read_timeout = read_timeout
        # (thread, viewer) -> (version, wire snapshot): the newest snapshot built for the class.
        self._bases: Bases = OrderedDict()
        # (thread, viewer) -> (version, wire snapshot) answered without a read (`seed`): kept
        # apart, so threads created in bulk never push out the bases of watched ones.
        self._seeds: Bases = OrderedDict()
        # (thread, viewer) -> (version asked, its build): later asks of that version share it.
        self._builds: OrderedDict[tuple[str, str], tuple[int, asyncio.Task[Built]]] = OrderedDict()
        self._running: set[asyncio.Task[Built]] = set()
        self.built = 0  # deltas sent (counted, for tests and benches)
        self.plain = 0  # plain invalidations sent instead

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def seed(self, principal: Principal, snapshot: Snapshot) -> None:
        """`snapshot` is what this gateway answered `principal` without reading it (a new
        thread's, `POST /v1/threads`): the base its viewer class starts from, so the delta
        subscription that usually follows needs no read to prime."""
        if not self.enabled:
            return
        key = (snapshot.thread.id, _viewer_key(principal))
        _keep(self._seeds, key, snapshot.thread.version, snapshot.to_wire(), self._capacity)

    def prime(self, thread_id: str, principal: Principal) -> None:
        """A delta subscriber of `thread_id` arrived: read its base now, unless one is kept
        (or was seeded: the seed becomes the base)."""
        key = (thread_id, _viewer_key(principal))
        seeded = self._seeds.pop(key, None)
        if seeded is not None and key not in self._bases:
            _keep(self._bases, key, *seeded, self._capacity)
        if key not in self._bases and key not in self._builds:
            self.request(thread_id, 0, principal)

    def request(
        self, thread_id: str, version: int, principal: Principal, viewer: str | None = None
    ) -> asyncio.Task[Built]:
        """The frame telling `principal` that `thread_id` committed `version`: a delta from the
        base kept for its viewer class when there is one, the plain invalidation otherwise.
        Never fails (a failure is the plain frame). `viewer`: `viewer_key(principal)`, when the
        caller keeps it (one digest per connection, not per connection and commit)."""
        key = (thread_id, viewer if viewer is not None else _viewer_key(principal))
        last = self._builds.get(key)
        if last is not None and last[0] >= version:
            self._builds.move_to_end(key)
            return last[1]
        previous = last[1] if last is not None else None
        task = asyncio.create_task(self._build(key, version, principal, previous))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        self._builds[key] = (version, task)
        self._builds.move_to_end(key)
        while len(self._builds) > self._capacity:
            self._builds.popitem(last=False)
        return task

    async def _build(
        self,
        key: tuple[str, str],
        version: int,
        principal: Principal,
        previous: asyncio.Task[Built] | None,
    ) -> Built:
        thread_id = key[0]
        plain = encode_invalidate(thread_id, version), version
        if previous is not None:
            await asyncio.wait([previous])  # bases advance in version order
        try:
            async with asyncio.timeout(self._read_timeout):
                snapshot = await self._read(thread_id, principal)
        except Exception as exc:  # a refusal, a storage hiccup, a slow read: refetch instead
            log.debug("no delta for %s at %d: %s", thread_id, version, exc)
            self.plain += 1
            return plain
        now = snapshot.thread.version
        wire = snapshot.to_wire()
        base = self._bases.get(key)
        _keep(self._bases, key, now, wire, self._capacity)
        if base is None or base[0] >= now or now < version:
            self.plain += 1
            return plain
        delta = diff(base[1], wire, base[0])
        delta["etag"] = snapshot_etag(principal, snapshot)
        frame = orjson.dumps(
            {"type": "invalidate", "thread_id": thread_id, "version": now, "delta": delta}
        )
        if len(frame) > self.max_bytes:
            self.plain += 1
            return plain
        self.built += 1
        return frame, now

    async def _read(self, thread_id: str, principal: Principal) -> Snapshot:
        """The default snapshot (`GET /v1/threads/{id}` with no query) as `principal` sees it,
        through the cache: the refetches of clients that cannot use the delta share the read."""
        service = self._service

        async def read() -> Snapshot:
            return await service.committed_snapshot(principal, thread_id)

        async def view(committed: Snapshot) -> Snapshot:
            return await service.view_snapshot(principal, committed)

        return await self._cache.snapshot(principal, ReadKey(thread_id), read, view)

    async def close(self) -> None:
        """Cancel the builds still running (their listeners are closing too)."""
        tasks = list(self._running)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _keep(
    bases: Bases, key: tuple[str, str], version: int, wire: dict[str, Any], capacity: int
) -> None:
    """Keep `wire` (the snapshot at `version`) under `key` unless a newer one is kept, the
    least recently kept out past `capacity`."""
    kept = bases.get(key)
    if kept is None or kept[0] < version:
        bases[key] = (version, wire)
        bases.move_to_end(key)
        while len(bases) > capacity:
            bases.popitem(last=False)
