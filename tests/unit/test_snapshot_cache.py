"""The gateway's snapshot cache: what it keys on, when it reads again, and conditional reads."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from realtime.hub import Freshness
from runtime.domain import Principal, Role, Snapshot, ThreadView
from runtime.errors import NotFound
from server.live.snapshot_cache import (
    ReadKey,
    SnapshotCache,
    etag_matches,
    snapshot_etag,
    viewer_key,
)

ALICE = Principal(subject="alice", role=Role.USER, scopes=frozenset({"acme"}))
ALICE_ADMIN = Principal(subject="alice", role=Role.ADMIN, scopes=frozenset({"acme"}))
BOB = Principal(subject="bob", role=Role.USER, scopes=frozenset({"acme"}))
EVE = Principal(subject="eve", role=Role.USER, scopes=frozenset({"other"}))
KEY = ReadKey("thr_1")


class Thread:
    """One thread's committed state and a hub's view of it, with counted reads."""

    def __init__(self) -> None:
        self.version = 1
        self.watch: object | None = object()
        self.announced: int | None = None
        self.epoch = 0
        self.reads = 0

    def freshness(self, thread_id: str) -> Freshness | None:
        if self.watch is None:
            return None
        return Freshness(self.watch, self.epoch, self.announced)

    def commit(self) -> None:
        self.version += 1
        self.announced = self.version

    async def read_for(self, principal: Principal) -> Snapshot:
        self.reads += 1
        if "acme" not in principal.scopes:
            raise NotFound("thread thr_1 not found")
        view = ThreadView(id="thr_1", scope="acme", title="t", version=self.version, metadata={})
        return Snapshot(thread=view, messages=(), pending_actions=(), run=None, queue=())


async def get(cache: SnapshotCache, thread: Thread, principal: Principal) -> Snapshot:
    async def read() -> Snapshot:
        return await thread.read_for(principal)

    async def view(committed: Snapshot) -> Snapshot:
        # What the service does: the reader's own permissions on a copy.
        return committed.model_copy(update={"permissions": {"who": principal.subject}})

    return await cache.snapshot(principal, KEY, read, view)


async def test_one_read_per_version_for_many_refetches() -> None:
    thread = Thread()
    cache = SnapshotCache(thread.freshness)
    for _ in range(50):
        assert (await get(cache, thread, ALICE)).thread.version == 1
    assert thread.reads == 1
    thread.commit()
    for _ in range(50):
        assert (await get(cache, thread, ALICE)).thread.version == 2
    assert thread.reads == 2
    assert cache.stats.hits == 98


async def test_viewers_share_the_read_never_the_view() -> None:
    thread = Thread()
    cache = SnapshotCache(thread.freshness)
    seen: dict[str, Any] = {}
    for principal in (ALICE, BOB, ALICE_ADMIN, ALICE, BOB):
        snapshot = await get(cache, thread, principal)
        assert snapshot.permissions == {"who": principal.subject}
        seen.setdefault(viewer_key(principal), snapshot)
        assert seen[viewer_key(principal)] is snapshot
    assert thread.reads == 1
    assert cache.stats.views == 3  # alice, bob, and alice as an admin: three viewers


def test_viewer_key_covers_everything_a_view_may_depend_on() -> None:
    keys = {
        viewer_key(p)
        for p in (
            ALICE,
            ALICE_ADMIN,
            BOB,
            ALICE.model_copy(update={"scopes": frozenset({"acme", "beta"})}),
            ALICE.model_copy(update={"groups": frozenset({"finance"})}),
            ALICE.model_copy(update={"display_name": "Alice"}),
            ALICE.model_copy(update={"claims": {"department": "sales"}}),
        )
    }
    assert len(keys) == 7
    assert viewer_key(ALICE) == viewer_key(ALICE.model_copy())


async def test_a_reader_outside_the_scope_never_gets_the_cached_snapshot() -> None:
    thread = Thread()
    cache = SnapshotCache(thread.freshness)
    await get(cache, thread, ALICE)
    with pytest.raises(NotFound):
        await get(cache, thread, EVE)
    assert thread.reads == 2  # storage answered eve, with its scope check


async def test_unwatched_threads_and_resyncs_read_again() -> None:
    thread = Thread()
    cache = SnapshotCache(thread.freshness)
    await get(cache, thread, ALICE)
    thread.epoch += 1  # the hub resynced: it may have missed invalidations
    await get(cache, thread, ALICE)
    assert thread.reads == 2
    thread.watch = object()  # unsubscribed, then watched again
    await get(cache, thread, ALICE)
    assert thread.reads == 3
    thread.watch = None  # nobody watches it here (or the bus is down)
    await get(cache, thread, ALICE)
    await get(cache, thread, ALICE)
    assert thread.reads == 5
    assert len(cache) == 1  # the last entry stored while watched, never served since


async def test_a_commit_through_this_gateway_counts_before_the_bus_says_so() -> None:
    thread = Thread()
    cache = SnapshotCache(thread.freshness)
    await get(cache, thread, ALICE)
    thread.version += 1  # committed; the invalidation has not reached the hub
    cache.saw("thr_1", thread.version)
    assert (await get(cache, thread, ALICE)).thread.version == 2
    assert thread.reads == 2


async def test_a_read_older_than_an_announcement_is_not_kept() -> None:
    thread = Thread()
    cache = SnapshotCache(thread.freshness)
    thread.announced = 5  # the hub heard of version 5; storage still answers 1 (a lagging read)
    await get(cache, thread, ALICE)
    await get(cache, thread, ALICE)
    assert thread.reads == 2
    assert len(cache) == 0


async def test_capacity_bounds_entries_and_zero_disables() -> None:
    thread = Thread()
    off = SnapshotCache(thread.freshness, capacity=0)
    await get(off, thread, ALICE)
    await get(off, thread, ALICE)
    assert thread.reads == 2 and len(off) == 0
    small = SnapshotCache(thread.freshness, capacity=2)

    async def read() -> Snapshot:
        return await thread.read_for(ALICE)

    async def same(committed: Snapshot) -> Snapshot:
        return committed

    for n in range(5):
        await small.snapshot(ALICE, ReadKey("thr_1", before=n), read, same)
    assert len(small) == 2
    with pytest.raises(ValueError):
        SnapshotCache(thread.freshness, capacity=-1)


def test_etags_name_version_and_viewer() -> None:
    snapshot = Snapshot(
        thread=ThreadView(id="t", scope="acme", title="", version=7, metadata={}),
        messages=(),
        pending_actions=(),
        run=None,
        queue=(),
    )
    tag = snapshot_etag(ALICE, snapshot)
    assert tag.startswith('"v7.') and tag.endswith('"')
    assert snapshot_etag(BOB, snapshot) != tag
    newer = snapshot.model_copy(
        update={"thread": snapshot.thread.model_copy(update={"version": 8})}
    )
    assert snapshot_etag(ALICE, newer) != tag
    assert etag_matches(tag, tag)
    assert etag_matches(f'"x", W/{tag}', tag)
    assert etag_matches("*", tag)
    assert not etag_matches(None, tag)
    assert not etag_matches('"v7"', tag)


async def test_concurrent_misses_share_one_read_within_a_scope() -> None:
    thread = Thread()
    cache = SnapshotCache(thread.freshness)
    gate = asyncio.Event()
    read_for = thread.read_for

    async def slow_read(principal: Principal) -> Snapshot:
        await gate.wait()
        return await read_for(principal)

    thread.read_for = slow_read  # type: ignore[method-assign]
    readers = [ALICE, BOB, EVE, ALICE, BOB]
    tasks = [asyncio.create_task(get(cache, thread, p)) for p in readers]
    for _ in range(10):  # every reader reaches the in-flight read
        await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[2], NotFound)  # eve joined alice's read, and was refused anyway
    assert [r.permissions for r in results if isinstance(r, Snapshot)] == [
        {"who": "alice"},
        {"who": "bob"},
        {"who": "alice"},
        {"who": "bob"},
    ]
    assert thread.reads == 2  # alice's, shared by the other three; eve's own
    thread.commit()
    await get(cache, thread, ALICE)
    assert thread.reads == 3


async def test_an_older_read_ending_after_a_newer_one_of_its_key_still_answers() -> None:
    """A commit announced while a read is in flight: the next miss reads on its own (a second
    flight of the key). Ending first, it clears the key; the older read, ending after it, still
    answers its readers (it failed them with a KeyError: the campaign's internal_error streams)."""
    thread = Thread()
    cache = SnapshotCache(thread.freshness)
    gates: list[asyncio.Event] = []
    read_for = thread.read_for

    async def gated_read(principal: Principal) -> Snapshot:
        gate = asyncio.Event()
        gates.append(gate)
        await gate.wait()
        return await read_for(principal)

    thread.read_for = gated_read  # type: ignore[method-assign]
    older = asyncio.create_task(get(cache, thread, ALICE))
    for _ in range(10):  # bounded: the older read reaches storage
        if gates:
            break
        await asyncio.sleep(0)
    thread.commit()
    newer = asyncio.create_task(get(cache, thread, ALICE))
    for _ in range(10):
        if len(gates) == 2:
            break
        await asyncio.sleep(0)
    assert len(gates) == 2  # the newer miss did not join the older flight
    gates[1].set()
    assert (await newer).thread.version == 2
    gates[0].set()
    assert (await older).thread.version == 2  # read after the commit: the committed state
    assert (await get(cache, thread, ALICE)).thread.version == 2
