"""Store conformance: queue bounds and the per-scope run cap, checked inside admission."""

from __future__ import annotations

import asyncio

import pytest

from runtime.errors import QueueFull, ScopeRunsExceeded
from runtime.storage.store import AdmissionLimits, Store
from tests.conformance.store_helpers import SCOPES, finish, new_thread, start_run


async def queued(store: Store, thread_id: str) -> int:
    return len([i for i in await store.list_queue(thread_id) if i.status == "queued"])


async def test_queue_is_refused_at_its_item_bound(store: Store) -> None:
    thread = await new_thread(store)
    await start_run(store, thread.id)
    limits = AdmissionLimits(queue_max_items=3, queue_max_bytes=10_000)
    for n in range(3):
        await store.submit_input(thread.id, SCOPES, text=f"q{n}", submitted_by="a", limits=limits)
    version = (await store.get_thread(thread.id, SCOPES)).version
    with pytest.raises(QueueFull) as refused:
        await store.submit_input(thread.id, SCOPES, text="q3", submitted_by="a", limits=limits)
    assert refused.value.retry_after >= 1 and refused.value.details["limit_items"] == 3
    # Nothing changed: no item, no version bump.
    assert await queued(store, thread.id) == 3
    assert (await store.get_thread(thread.id, SCOPES)).version == version


async def test_queue_is_refused_at_its_byte_bound_counting_utf8(store: Store) -> None:
    thread = await new_thread(store)
    await start_run(store, thread.id)
    limits = AdmissionLimits(queue_max_items=100, queue_max_bytes=1024)
    wide = "é" * 300  # 600 bytes in UTF-8, 300 characters
    await store.submit_input(thread.id, SCOPES, text=wide, submitted_by="a", limits=limits)
    with pytest.raises(QueueFull):
        await store.submit_input(thread.id, SCOPES, text=wide, submitted_by="a", limits=limits)
    await store.submit_input(thread.id, SCOPES, text="x" * 424, submitted_by="a", limits=limits)
    assert await queued(store, thread.id) == 2
    # Without limits the store itself stays unbounded (the service passes the settings).
    await store.submit_input(thread.id, SCOPES, text=wide, submitted_by="a")
    assert await queued(store, thread.id) == 3


async def test_a_scope_at_its_run_cap_cannot_start_another_run(store: Store) -> None:
    limits = AdmissionLimits(scope_max_active_runs=2)
    threads = [await new_thread(store) for _ in range(3)]
    for thread in threads[:2]:
        admission = await store.submit_input(
            thread.id, SCOPES, text="go", submitted_by="a", limits=limits
        )
        assert admission.run_id is not None
    before = await store.snapshot(threads[2].id, SCOPES)
    with pytest.raises(ScopeRunsExceeded) as refused:
        await store.submit_input(threads[2].id, SCOPES, text="go", submitted_by="a", limits=limits)
    assert refused.value.details["limit"] == 2
    # The refusal changed nothing: no run, no message, no version bump.
    assert await store.active_run(threads[2].id) is None
    after = await store.snapshot(threads[2].id, SCOPES)
    assert after.thread.version == before.thread.version and after.messages == before.messages
    # Another scope is not affected by this one's runs.
    other = await new_thread(store, scope="globex")
    admission = await store.submit_input(
        other.id, ["globex"], text="go", submitted_by="b", limits=limits
    )
    assert admission.run_id is not None


async def test_the_scope_run_cap_is_exact_under_concurrent_starts(store: Store) -> None:
    # Twelve threads of one scope start at once (a pool of connections on Postgres): without
    # a lock per scope each count misses the others' uncommitted runs and all would pass.
    cap = 3
    limits = AdmissionLimits(scope_max_active_runs=cap)
    threads = [await new_thread(store) for _ in range(12)]

    async def start(thread_id: str) -> str:
        try:
            await store.submit_input(thread_id, SCOPES, text="go", submitted_by="a", limits=limits)
        except ScopeRunsExceeded:
            return "refused"
        return "admitted"

    for attempt in range(3):  # three rounds: the race has more than one chance to show
        outcomes = await asyncio.gather(*(start(t.id) for t in threads))
        active = [t.id for t in threads if await store.active_run(t.id) is not None]
        assert outcomes.count("admitted") == len(active) == cap, (attempt, outcomes)
        for thread_id in active:
            run = await store.active_run(thread_id)
            assert run is not None
            await store.request_stop(thread_id, SCOPES, run.id)  # queued: cancelled at once
        assert all([await store.active_run(t.id) is None for t in threads])


async def test_a_bounded_snapshot_pages_back_through_every_message(store: Store) -> None:
    thread = await new_thread(store)
    for n in range(7):
        _, lease = await start_run(store, thread.id, text=f"m{n}")
        await finish(store, lease)
    whole = await store.snapshot(thread.id, SCOPES)
    assert whole.page is None and len(whole.messages) == 7
    seen: list[str] = []
    before = None
    pages = 0
    while True:
        page = await store.snapshot(thread.id, SCOPES, message_limit=3, before=before)
        assert page.page is not None and len(page.messages) <= 3
        seen = [m.id for m in page.messages] + seen
        pages += 1
        before = page.page["before"]
        if before is None:
            break
    assert seen == [m.id for m in whole.messages] and pages == 3


async def test_runnable_runs_go_round_robin_across_scopes(store: Store) -> None:
    # Scope acme floods first: five runs, then globex's one run arrives last.
    flood = []
    for n in range(5):
        thread = await new_thread(store)
        admission = await store.submit_input(thread.id, SCOPES, text=f"a{n}", submitted_by="a")
        flood.append(admission.run_id)
    other = await new_thread(store, scope="globex")
    late = await store.submit_input(other.id, ["globex"], text="b", submitted_by="b")
    picked = [run.id for run in await store.find_runnable_runs(limit=2)]
    # Before round robin this was acme's first two: globex waited for the whole burst.
    assert picked == [flood[0], late.run_id]
    everything = [run.id for run in await store.find_runnable_runs(limit=10)]
    assert everything == [flood[0], late.run_id, *flood[1:]]


async def flood(store: Store, count: int, scope: str = "acme") -> list[str]:
    runs = []
    for n in range(count):
        thread = await new_thread(store, scope=scope)
        admission = await store.submit_input(
            thread.id, [scope], text=f"{scope}{n}", submitted_by="a"
        )
        assert admission.run_id is not None
        runs.append(admission.run_id)
    return runs


async def test_a_scope_s_runs_in_progress_count_as_its_turns(store: Store) -> None:
    acme = await flood(store, 3)
    assert await store.acquire_run_lease(acme[0], "w1", 30.0) is not None
    globex = await flood(store, 1, "globex")
    # acme's next run is its second turn (one already runs): globex's first goes before it,
    # although it arrived last.
    assert [run.id for run in await store.find_runnable_runs(limit=1)] == globex
    assert [run.id for run in await store.find_runnable_runs(limit=10)] == [*globex, *acme[1:]]


async def test_of_equal_turns_the_scope_served_longest_ago_goes_first(store: Store) -> None:
    acme = await flood(store, 3)
    # One worker slot: acme's first run ran and ended just before globex's run arrived.
    lease = await store.acquire_run_lease(acme[0], "w1", 30.0)
    assert lease is not None
    await store.start_episode(lease)
    await finish(store, lease)
    await store.release_lease(lease)
    globex = await flood(store, 2, "globex")
    # Both scopes offer a first turn now; acme was just served, globex never was.
    picked = (await store.find_runnable_runs(limit=1))[0].id
    assert picked == globex[0]
    lease = await store.acquire_run_lease(picked, "w1", 30.0)
    assert lease is not None
    await store.start_episode(lease)
    await finish(store, lease)
    await store.release_lease(lease)
    # Now globex was served last: acme's turn, then they alternate.
    assert [run.id for run in await store.find_runnable_runs(limit=10)] == [
        acme[1],
        globex[1],
        acme[2],
    ]
