"""Per-gateway snapshot cache: one storage read per thread version, however many tabs refetch.

Every commit invalidates every watcher, and every watcher refetches: a thread open in 1 000 tabs
cost 1 000 snapshot reads per commit. A gateway that watches a thread (its hub holds the
thread's bus subscription) hears every invalidation before its connections do, so it can tell
whether a snapshot it read is still the newest it knows of (`realtime.hub.Freshness`). This
cache keeps such reads:

- the committed snapshot, by thread and query (`include_hidden`, `before`, `limit`): the same
  for every reader of the thread's scope, so a hit still checks the reader's scopes;
- per committed snapshot, the snapshot as each viewer sees it (queue previews, `permissions`),
  by everything of the principal a view may depend on (`viewer_key`): two viewers never share
  a view unless they are the same principal.

An entry is served only while the hub vouches for the thread (watched here, bus healthy, no
resync due) and no newer version was announced or committed through this gateway (`saw`).
Otherwise, and for threads nobody watches here, reads go to storage as before. Entries are
bounded (least recently used out first); capacity 0 disables the cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import orjson

from realtime.bus_metrics import safe_add
from realtime.hub import Freshness
from runtime.domain import Principal, Snapshot
from server.tracing import SNAPSHOT_READS

# Distinct viewers kept per committed snapshot (the rest are read again, never mixed up).
VIEWS_PER_ENTRY = 64
DEFAULT_CAPACITY = 1024

FreshnessOf = Callable[[str], "Freshness | None"]
Read = Callable[[], Awaitable[Snapshot]]
View = Callable[[Snapshot], Awaitable[Snapshot]]


@dataclass(frozen=True)
class ReadKey:
    """What a committed snapshot read depends on besides the thread's version."""

    thread_id: str
    include_hidden: bool = False
    before: int | None = None
    limit: int | None = None


def viewer_key(principal: Principal) -> str:
    """A digest of everything of `principal` a view of a snapshot may depend on: subject, role,
    scopes, display name, groups and a JWT's claims (an authorization policy may read any)."""
    identity = [
        principal.subject,
        str(principal.role),
        sorted(principal.scopes),
        principal.display_name,
        sorted(principal.groups),
        principal.claims,
    ]
    encoded = orjson.dumps(identity, option=orjson.OPT_SORT_KEYS, default=str)
    return hashlib.blake2b(encoded, digest_size=12).hexdigest()


def snapshot_etag(principal: Principal, snapshot: Snapshot) -> str:
    """The entity tag of `snapshot` as `principal` sees it: its version, and the viewer (two
    viewers' snapshots at one version differ in what each may do)."""
    return f'"v{snapshot.thread.version}.{viewer_key(principal)}"'


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """Whether an `If-None-Match` header names `etag` (weak comparison, as RFC 9110 asks)."""
    if not if_none_match:
        return False
    for candidate in if_none_match.split(","):
        tag = candidate.strip()
        if tag == "*" or tag.removeprefix("W/") == etag:
            return True
    return False


@dataclass
class _Entry:
    snapshot: Snapshot  # as read from storage, before any viewer's view
    read_with: Freshness
    views: dict[str, Snapshot] = field(default_factory=dict)

    @property
    def version(self) -> int:
        return self.snapshot.thread.version


@dataclass
class CacheStats:
    """Counted, for the benches and tests: reads served from storage and from the cache."""

    reads: int = 0
    hits: int = 0
    views: int = 0  # views built (a viewer not yet cached for a committed snapshot)


class SnapshotCache:
    """The gateway's cache of snapshots of watched threads (see the module's docstring)."""

    def __init__(self, freshness: FreshnessOf, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 0:
            raise ValueError("capacity must be at least 0")
        self._freshness = freshness
        self.capacity = capacity
        self._entries: OrderedDict[ReadKey, _Entry] = OrderedDict()
        # Newest version committed through this gateway per thread (its own commands' answers
        # may reach a client before the bus's invalidation reaches the hub): bounded, as the
        # entries are, the oldest forgotten first.
        self._seen: OrderedDict[str, int] = OrderedDict()
        # Reads in flight: (what the reader knew, its `_seen` version, the read's entry).
        self._flights: dict[ReadKey, tuple[Freshness, int, asyncio.Future[_Entry]]] = {}
        self.stats = CacheStats()

    def __len__(self) -> int:
        return len(self._entries)

    def saw(self, thread_id: str, version: int) -> None:
        """A commit of `thread_id` at `version` through this gateway: older entries are stale."""
        if self.capacity == 0:
            return
        if self._seen.get(thread_id, -1) < version:
            self._seen[thread_id] = version
            self._seen.move_to_end(thread_id)
            while len(self._seen) > 4 * self.capacity:
                self._seen.popitem(last=False)

    def _current(self, entry: _Entry, now: Freshness | None) -> bool:
        return (
            now is not None
            and now.covers(entry.read_with, entry.version)
            and entry.version >= self._seen.get(entry.snapshot.thread.id, -1)
        )

    async def snapshot(
        self, principal: Principal, key: ReadKey, read: Read, view: View
    ) -> Snapshot:
        """The snapshot `view(read())` would give `principal`, from the cache when current.

        `read` reads the committed snapshot from storage within the principal's scopes (and
        raises `not_found` outside them); `view` turns it into what this principal sees."""
        before = self._freshness(key.thread_id) if self.capacity else None
        if before is None:
            self._count("storage")
            return await view(await read())
        entry = self._entries.get(key)
        if entry is not None and not self._current(entry, before):
            del self._entries[key]
            entry = None
        if entry is None:
            entry = await self._read(key, before, read)
        else:
            self._count("cache")
            self._entries.move_to_end(key)
        if not principal.can_access(entry.snapshot.thread.scope):
            # Another scope's reader: storage answers it (`not_found`), nothing is shared.
            self._count("storage")
            return await view(await read())
        viewer = viewer_key(principal)
        viewed = entry.views.get(viewer)
        if viewed is None:
            self.stats.views += 1
            viewed = await view(entry.snapshot)
            if len(entry.views) < VIEWS_PER_ENTRY:
                entry.views[viewer] = viewed
        return viewed

    async def _read(self, key: ReadKey, before: Freshness, read: Read) -> _Entry:
        """A storage read for `key`, shared by the callers that miss while it is in flight and
        knew what it knew when it started (a commit announced since needs a read of its own)."""
        seen = self._seen.get(key.thread_id, -1)
        flight = self._flights.get(key)
        if flight is not None and flight[0] == before and flight[1] == seen:
            with contextlib.suppress(Exception):  # its reader's refusal is not this reader's
                entry = await asyncio.shield(flight[2])
                self._count("cache")
                return entry
        self._count("storage")
        future: asyncio.Future[_Entry] = asyncio.get_running_loop().create_future()
        self._flights[key] = (before, seen, future)
        try:
            entry = _Entry(await read(), before)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a flight nobody joined must not warn
            raise
        finally:
            # Only its own flight: a newer one of the key (a commit announced meanwhile) may
            # have replaced it, and ended first (clearing the key) or be still in flight.
            flight = self._flights.get(key)
            if flight is not None and flight[2] is future:
                del self._flights[key]
        future.set_result(entry)
        if self._current(entry, self._freshness(key.thread_id)):
            self._entries[key] = entry
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return entry

    def _count(self, source: str) -> None:
        if source == "cache":
            self.stats.hits += 1
        else:
            self.stats.reads += 1
        safe_add(SNAPSHOT_READS, 1, {"source": source})
