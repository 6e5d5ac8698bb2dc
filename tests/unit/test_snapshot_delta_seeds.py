"""The delta builder's seeds: a new thread's snapshot, answered without a read, is the base the
creator's delta subscription starts from (no prime read), and only the creator's viewer class's;
seeds never push out the bases of watched threads."""

from __future__ import annotations

from typing import Any

import orjson

from realtime.hub import Freshness
from runtime.domain import Principal, Role, Snapshot, ThreadView
from server.live.snapshot_cache import SnapshotCache
from server.live.snapshot_deltas import SnapshotDeltas

ALICE = Principal(subject="alice", role=Role.USER, scopes=frozenset({"acme"}))
BOB = Principal(subject="bob", role=Role.USER, scopes=frozenset({"acme"}))


def snapshot(thread_id: str, version: int, title: str = "t") -> Snapshot:
    view = ThreadView(id=thread_id, scope="acme", title=title, version=version, metadata={})
    return Snapshot(thread=view, messages=(), pending_actions=(), run=None, queue=())


class Source:
    """Committed threads by id, each read counted (the service's two reads of a delta)."""

    def __init__(self) -> None:
        self.threads: dict[str, Snapshot] = {}
        self.reads: list[tuple[str, str]] = []
        self.watch = object()

    def freshness(self, thread_id: str) -> Freshness | None:
        return Freshness(self.watch, 0, None)

    async def committed_snapshot(self, principal: Principal, thread_id: str) -> Snapshot:
        self.reads.append((principal.subject, thread_id))
        return self.threads[thread_id]

    async def view_snapshot(self, principal: Principal, committed: Snapshot) -> Snapshot:
        return committed


def builder(source: Source, capacity: int = 8) -> SnapshotDeltas:
    # No cache (capacity 0): every build reads, so the reads counted are the builder's own.
    return SnapshotDeltas(SnapshotCache(source.freshness, 0), source, capacity=capacity)


def seeded_thread(source: Source, deltas: SnapshotDeltas) -> Snapshot:
    """`thr_1` created (version 1) and its answer seeded for alice, as `POST /v1/threads` does."""
    created = snapshot("thr_1", 1)
    source.threads["thr_1"] = created
    deltas.seed(ALICE, created)
    return created


def frame(built: tuple[bytes, int]) -> dict[str, Any]:
    decoded = orjson.loads(built[0])
    assert isinstance(decoded, dict)
    return decoded


async def test_a_seeded_subscription_needs_no_prime_read_and_gets_a_delta() -> None:
    source = Source()
    deltas = builder(source)
    seeded_thread(source, deltas)
    deltas.prime("thr_1", ALICE)
    assert source.reads == []  # the seed is the base
    source.threads["thr_1"] = snapshot("thr_1", 2, title="renamed")
    got = frame(await deltas.request("thr_1", 2, ALICE))
    assert source.reads == [("alice", "thr_1")]
    assert got["version"] == 2 and got["delta"]["from"] == 1
    assert deltas.built == 1 and deltas.plain == 0


async def test_a_seed_is_the_creators_viewer_class_only() -> None:
    source = Source()
    deltas = builder(source)
    seeded_thread(source, deltas)
    deltas.prime("thr_1", BOB)
    await deltas.request("thr_1", 0, BOB)  # the prime's build, shared
    assert source.reads == [("bob", "thr_1")]  # bob's class reads its own base


async def test_seeds_never_push_out_the_bases_of_watched_threads() -> None:
    source = Source()
    deltas = builder(source, capacity=2)
    source.threads["watched"] = snapshot("watched", 1)
    deltas.prime("watched", ALICE)
    await deltas.request("watched", 0, ALICE)
    for n in range(10):  # threads created in bulk, never subscribed
        created = snapshot(f"bulk_{n}", 1)
        source.threads[created.thread.id] = created
        deltas.seed(ALICE, created)
    source.threads["watched"] = snapshot("watched", 2, title="renamed")
    got = frame(await deltas.request("watched", 2, ALICE))
    assert got["delta"]["from"] == 1  # the watched thread's base survived
    # The oldest seeds went: priming one of them reads again.
    reads = len(source.reads)
    deltas.prime("bulk_0", ALICE)
    await deltas.request("bulk_0", 0, ALICE)
    assert len(source.reads) == reads + 1
    deltas.prime("bulk_9", ALICE)
    assert len(source.reads) == reads + 1


async def test_an_older_seed_never_replaces_a_newer_base() -> None:
    source = Source()
    deltas = builder(source)
    source.threads["thr_1"] = snapshot("thr_1", 3)
    deltas.prime("thr_1", ALICE)
    await deltas.request("thr_1", 0, ALICE)
    deltas.seed(ALICE, snapshot("thr_1", 1))
    deltas.prime("thr_1", ALICE)
    source.threads["thr_1"] = snapshot("thr_1", 4, title="renamed")
    got = frame(await deltas.request("thr_1", 4, ALICE))
    assert got["delta"]["from"] == 3
