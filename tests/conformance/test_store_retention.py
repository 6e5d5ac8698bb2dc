"""Thread retention on the `HooksStore` interface, on both backends: idle threads deleted,
live ones kept, by one durable timer the deployment's workers share."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from runtime.domain import RunStatus
from runtime.errors import NotFound
from runtime.storage import SqlStore
from runtime.storage.hooks_store import ScheduleSpec
from runtime.storage.retention import RetentionPolicy
from runtime.storage.sql.hooks_sql import SqlHooks
from runtime.storage.sql.retention_tx import KIND
from tests.conformance.store_helpers import SCOPE, SCOPES, finish, new_thread, start_run, suspend

MAX_WAITS = 2000  # a bound on waiting for the database clock to move on


@pytest.fixture
async def hooks(sql_store: SqlStore) -> AsyncIterator[SqlHooks]:
    yield SqlHooks(sql_store)


async def _after(store: SqlStore, at: float) -> float:
    """Wait until the database clock is past `at` (bounded); its time then."""
    for _ in range(MAX_WAITS):
        now = await store.db_time()
        if now > at:
            return now
        await asyncio.sleep(max(0.001, at - now))
    raise AssertionError(f"the database clock never passed {at}")


async def _exists(store: SqlStore, thread_id: str) -> bool:
    try:
        await store.get_thread(thread_id, SCOPES)
    except NotFound:
        return False
    return True


async def test_idle_threads_go_and_live_ones_stay(sql_store: SqlStore, hooks: SqlHooks) -> None:
    store = sql_store
    idle = await new_thread(store, "idle")
    done = await new_thread(store, "done")
    _, done_lease = await start_run(store, done.id)
    await finish(store, done_lease)
    running = await new_thread(store, "running")
    _, running_lease = await start_run(store, running.id)
    waiting = await new_thread(store, "waiting")
    _, waiting_lease = await start_run(store, waiting.id)
    await suspend(store, waiting_lease, "act-keep")
    queued = await new_thread(store, "queued")
    await store.submit_input(queued.id, SCOPES, text="later", submitted_by="alice")
    rewriting = await new_thread(store, "rewriting")  # a history rewrite holds its lease
    assert await store.acquire_admin_lease(rewriting.id, "admin-1", 3600.0) is not None
    scheduled = await new_thread(store, "scheduled")
    now = await store.db_time()
    await hooks.create_schedule(
        ScheduleSpec(scope=SCOPE, thread_id=scheduled.id, run_at=now + 3600, text="hi"), "alice"
    )
    cutoff = await _after(store, await store.db_time())
    await _after(store, cutoff)
    fresh = await new_thread(store, "fresh")

    deleted = await hooks.expire_threads(cutoff, 100)

    assert sorted(deleted) == sorted([idle.id, done.id])
    assert not await _exists(store, idle.id) and not await _exists(store, done.id)
    for kept in (running, waiting, queued, rewriting, scheduled, fresh):
        assert await _exists(store, kept.id), kept.title
    pending = [a.id for a in (await store.snapshot(waiting.id, SCOPES)).pending_actions]
    assert pending == ["act-keep"]
    # The kept run goes on committing; once it ended, its thread is idle like any other.
    await finish(store, running_lease, RunStatus.COMPLETED)
    later = await _after(store, await store.db_time())
    assert running.id in await hooks.expire_threads(later, 100)
    assert await hooks.expire_threads(cutoff, 100) == []


async def test_one_transaction_deletes_at_most_its_limit_oldest_first(
    sql_store: SqlStore, hooks: SqlHooks
) -> None:
    threads = [await new_thread(sql_store, f"t{n}") for n in range(3)]
    cutoff = await _after(sql_store, await sql_store.db_time())
    updated = sorted(threads, key=lambda t: (t.updated_at, t.id))
    assert await hooks.expire_threads(cutoff, 2) == sorted(t.id for t in updated[:2])
    assert await hooks.expire_threads(cutoff, 2) == [updated[2].id]


async def _retention_timers(hooks: SqlHooks, owner: str) -> list[str]:
    return [t.ref for t in await hooks.claim_timers(owner, 5.0, 50) if t.kind == KIND]


async def test_the_timer_runs_once_per_interval_across_workers(
    sql_store: SqlStore, hooks: SqlHooks
) -> None:
    policy = RetentionPolicy(idle_for=0.05, interval=3600.0)
    old = await new_thread(sql_store, "old")
    await _after(sql_store, old.updated_at + policy.idle_for)
    # Three workers start with the policy: one timer, due at once, kept where it is.
    for _ in range(3):
        await hooks.set_retention(policy)
    claims = await asyncio.gather(*(hooks.claim_timers(f"w{n}", 5.0, 10) for n in range(4)))
    timers = [timer for claim in claims for timer in claim if timer.kind == KIND]
    assert [t.ref for t in timers] == [policy.ref]
    fresh = await new_thread(sql_store, "fresh")
    result = await hooks.fire_timer(timers[0])
    assert result.fired and not await _exists(sql_store, old.id)
    assert await _exists(sql_store, fresh.id)  # idle for less than idle_for
    assert not (await hooks.fire_timer(timers[0])).fired  # its token is spent
    # Moved an interval on: nothing due now, even after another worker starts.
    await hooks.set_retention(policy)
    assert await _retention_timers(hooks, "w5") == []
    # Another policy replaces it, due at once.
    other = RetentionPolicy(idle_for=7 * 86400.0, interval=60.0)
    await hooks.set_retention(other)
    assert await _retention_timers(hooks, "w6") == [other.ref]
    # None removes it, leased or not: set again, it is a new timer (a kept one stays leased).
    await hooks.set_retention(None)
    await hooks.set_retention(other)
    assert await _retention_timers(hooks, "w7") == [other.ref]
    await hooks.set_retention(other)
    await hooks.set_retention(None)
    assert await _retention_timers(hooks, "w8") == []
