"""Timers, schedules and the webhook outbox on the `HooksStore` interface, on both backends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from runtime.domain import InputPolicy, RunStatus
from runtime.errors import InvalidInput, NotFound
from runtime.storage import SqlStore
from runtime.storage.hooks_store import (
    AttemptOutcome,
    DeliveryState,
    MissedFire,
    ScheduleSpec,
    ScheduleStatus,
    WebhookEvent,
)
from runtime.storage.sql.core import Conn
from runtime.storage.sql.hooks_sql import SqlHooks
from tests.conformance.store_helpers import (
    FOREIGN,
    SCOPE,
    SCOPES,
    finish,
    new_thread,
    resolution,
    start_run,
    suspend,
)


@pytest.fixture
async def store(sql_store: SqlStore) -> SqlStore:
    """`SqlHooks` shares a SQL store's pool: SQLite and Postgres."""
    return sql_store


@pytest.fixture
async def hooks(store: SqlStore) -> AsyncIterator[SqlHooks]:
    yield SqlHooks(store, schedules_per_scope=3)


async def _due(hooks: SqlHooks, store: SqlStore, at: float) -> None:
    """Wait (by the database clock) until `at` has passed."""
    await asyncio.sleep(max(0.0, at - await store.db_time()) + 0.02)
    assert await store.db_time() > at


async def test_a_due_timer_fires_once_across_racing_workers(
    store: SqlStore, hooks: SqlHooks
) -> None:
    thread = await new_thread(store)
    now = await store.db_time()
    schedule = await hooks.create_schedule(
        ScheduleSpec(scope=SCOPE, thread_id=thread.id, run_at=now + 0.2, text="ping"), "alice"
    )
    assert schedule.next_fire_at == pytest.approx(now + 0.2)
    await _due(hooks, store, now + 0.2)
    # Four workers claim at once: one gets the timer.
    claims = await asyncio.gather(*(hooks.claim_timers(f"w{n}", 5.0, 10) for n in range(4)))
    timers = [timer for claim in claims for timer in claim]
    assert len(timers) == 1
    # A stale claim (an older token) is refused; the holder's fires.
    stale = timers[0].model_copy(update={"token": timers[0].token - 1})
    assert not (await hooks.fire_timer(stale)).fired
    result = await hooks.fire_timer(timers[0])
    assert result.fired and result.run_id is not None
    # Firing again (a retry of a lost answer, a takeover) admits nothing twice.
    assert not (await hooks.fire_timer(timers[0])).fired
    fires = await hooks.schedule_fires(SCOPES, schedule.id)
    assert [fire.outcome for fire in fires] == ["admitted"]
    snapshot = await store.snapshot(thread.id, SCOPES)
    assert [m.role.value for m in snapshot.messages] == ["user"]
    done = await hooks.get_schedule(SCOPES, schedule.id)
    assert done.status is ScheduleStatus.DONE and done.next_fire_at is None
    assert await hooks.claim_timers("w9", 5.0, 10) == []


def count_write_transactions(hooks: SqlHooks, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many write transactions `hooks` opens from now on."""
    real, opened = hooks._transaction, [0]

    @asynccontextmanager
    async def counting(*, write: bool) -> AsyncIterator[Conn]:
        opened[0] += write
        async with real(write=write) as conn:
            yield conn

    monkeypatch.setattr(hooks, "_transaction", counting)
    return opened


async def test_idle_polls_open_no_write_transaction(
    store: SqlStore, hooks: SqlHooks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The timer and delivery loops poll several times a second: with nothing due (nothing at
    all, a timer not due yet, one leased by another worker) a poll only reads."""
    thread = await new_thread(store)
    await hooks.create_subscription(
        SCOPE, "http://127.0.0.1:9/a", [WebhookEvent.RUN_STARTED], "whsec_dGVzdA==", "ops"
    )
    now = await store.db_time()
    await hooks.create_schedule(
        ScheduleSpec(scope=SCOPE, thread_id=thread.id, run_at=now + 60, text="later"), "alice"
    )
    opened = count_write_transactions(hooks, monkeypatch)
    for _ in range(3):
        assert await hooks.claim_timers("w1", 5.0, 10) == []
        assert await hooks.claim_deliveries("d1", 5.0, 10) == []
    assert opened == [0]
    await start_run(store, thread.id)  # a delivery is due now
    [claimed] = await hooks.claim_deliveries("d1", 5.0, 10)
    assert opened == [1]
    assert await hooks.claim_deliveries("d2", 5.0, 10) == []  # leased: read, nothing claimed
    assert opened == [1] and claimed.delivery.attempts == 0


async def test_an_expired_claim_is_taken_over_and_the_first_holder_is_fenced(
    store: SqlStore, hooks: SqlHooks
) -> None:
    thread = await new_thread(store)
    now = await store.db_time()
    await hooks.create_schedule(
        ScheduleSpec(scope=SCOPE, thread_id=thread.id, run_at=now, text="ping"), "alice"
    )
    [first] = await hooks.claim_timers("w1", 0.2, 10)
    assert await hooks.claim_timers("w2", 5.0, 10) == []  # leased
    await _due(hooks, store, now + 0.3)
    [second] = await hooks.claim_timers("w2", 5.0, 10)
    assert second.token > first.token
    assert not (await hooks.fire_timer(first)).fired  # the worker that lost its lease
    assert (await hooks.fire_timer(second)).fired


async def test_cron_fires_follow_the_missed_fire_policy(store: SqlStore, hooks: SqlHooks) -> None:
    thread = await new_thread(store)
    specs = {
        policy: await hooks.create_schedule(
            ScheduleSpec(
                scope=SCOPE,
                thread_id=thread.id,
                cron="* * * * * *",  # every second (cronsim: seconds first)
                text=f"tick {policy.value}",
                missed=policy,
                misfire_grace=0.5,
            ),
            "alice",
        )
        for policy in MissedFire
    }
    first = max(s.next_fire_at or 0 for s in specs.values())
    # Nobody fires for 2.5 s after the first fire was due: every one is missed.
    await _due(hooks, store, first + 2.5)
    timers = await hooks.claim_timers("w1", 5.0, 10)
    assert len(timers) == 2
    for timer in timers:
        assert (await hooks.fire_timer(timer)).fired
    run_once = await hooks.schedule_fires(SCOPES, specs[MissedFire.RUN_ONCE].id)
    skip = await hooks.schedule_fires(SCOPES, specs[MissedFire.SKIP].id)
    assert [f.outcome for f in run_once] == ["admitted"]
    assert [f.outcome for f in skip] == ["skipped_missed"]
    # Both resume with the next fire after now, not with each missed one.
    now = await store.db_time()
    for schedule in specs.values():
        fresh = await hooks.get_schedule(SCOPES, schedule.id)
        assert fresh.next_fire_at is not None and now < fresh.next_fire_at <= now + 1.0


async def test_a_busy_thread_follows_the_schedules_policy(store: SqlStore, hooks: SqlHooks) -> None:
    thread = await new_thread(store)
    await start_run(store, thread.id)  # the thread is busy
    now = await store.db_time()
    for policy in (InputPolicy.ENQUEUE, InputPolicy.REJECT):
        await hooks.create_schedule(
            ScheduleSpec(
                scope=SCOPE, thread_id=thread.id, run_at=now, text=policy.value, policy=policy
            ),
            "alice",
        )
    for timer in await hooks.claim_timers("w1", 5.0, 10):
        await hooks.fire_timer(timer)
    outcomes = []
    for schedule in await hooks.list_schedules(SCOPES):
        outcomes += [fire.outcome for fire in await hooks.schedule_fires(SCOPES, schedule.id)]
    outcomes.sort()
    assert outcomes == ["queued", "refused_busy"]


async def test_new_thread_schedules_pause_resume_delete_and_scopes(
    store: SqlStore, hooks: SqlHooks
) -> None:
    now = await store.db_time()
    schedule = await hooks.create_schedule(
        ScheduleSpec(
            scope=SCOPE,
            new_thread=True,
            title="digest",
            cron="0 9 * * *",
            timezone="Europe/Paris",
            text="digest",
        ),
        "alice",
    )
    assert schedule.next_fire_at is not None and schedule.next_fire_at > now
    paused = await hooks.set_schedule_paused(SCOPES, schedule.id, True)
    assert paused.status is ScheduleStatus.PAUSED and paused.next_fire_at is None
    resumed = await hooks.set_schedule_paused(SCOPES, schedule.id, False)
    assert resumed.status is ScheduleStatus.ACTIVE and resumed.next_fire_at is not None
    with pytest.raises(NotFound):
        await hooks.get_schedule(FOREIGN, schedule.id)
    with pytest.raises(NotFound):
        await hooks.delete_schedule(FOREIGN, schedule.id)
    await hooks.delete_schedule(SCOPES, schedule.id)
    assert await hooks.list_schedules(SCOPES) == []
    for bad in (
        ScheduleSpec(scope=SCOPE, new_thread=True, cron="61 * * * *", text="x"),
        ScheduleSpec(scope=SCOPE, new_thread=True, cron="* * * * *", timezone="Mars/X", text="x"),
        ScheduleSpec(scope=SCOPE, new_thread=True, text="x"),
        ScheduleSpec(scope=SCOPE, new_thread=True, run_at=now, cron="* * * * *", text="x"),
    ):
        with pytest.raises(InvalidInput):
            await hooks.create_schedule(bad, "alice")
    with pytest.raises(NotFound):  # a thread outside the scope is not found
        await hooks.create_schedule(
            ScheduleSpec(
                scope="other", thread_id=(await new_thread(store)).id, run_at=now, text="x"
            ),
            "mallory",
        )


async def test_the_outbox_holds_one_row_per_committed_event(
    store: SqlStore, hooks: SqlHooks
) -> None:
    everything = await hooks.create_subscription(
        SCOPE, "http://127.0.0.1:9/a", list(WebhookEvent), "whsec_dGVzdA==", "ops"
    )
    ends = await hooks.create_subscription(
        SCOPE, "http://127.0.0.1:9/b", [WebhookEvent.RUN_COMPLETED], "whsec_dGVzdA==", "ops"
    )
    await hooks.create_subscription(
        "other", "http://127.0.0.1:9/c", list(WebhookEvent), "whsec_dGVzdA==", "ops"
    )
    thread = await new_thread(store)
    admission, lease = await start_run(store, thread.id)
    await suspend(store, lease, "act-1")
    await store.release_lease(lease)
    await store.resolve_action(thread.id, SCOPES, "act-1", resolution())
    lease2 = await store.acquire_run_lease(admission.run_id or "", "w1", 30.0)
    assert lease2 is not None
    await store.start_episode(lease2)
    await finish(store, lease2, RunStatus.COMPLETED)
    deliveries = await hooks.list_deliveries(SCOPES, everything.id)
    # In commit order; the events of one transaction share its time and come in any order.
    assert sorted(d.event_type for d in deliveries) == sorted(
        [
            "message.committed",  # the user's input
            "run.started",
            "message.committed",  # the assistant's message, holding the action
            "action.created",
            "action.resolved",
            "run.completed",
        ]
    )
    started = next(d for d in deliveries if d.event_type == "run.started")
    ended = next(d for d in deliveries if d.event_type == "run.completed")
    assert started.occurred_at <= ended.occurred_at
    assert len({d.id for d in deliveries}) == len(deliveries)
    [completed] = await hooks.list_deliveries(SCOPES, ends.id)
    assert completed.event_type == "run.completed" and completed.run_id == admission.run_id
    assert completed.payload()["data"]["thread_id"] == thread.id
    with pytest.raises(NotFound):
        await hooks.list_deliveries(FOREIGN, everything.id)


async def test_deliveries_retry_die_and_are_redelivered_by_id(
    store: SqlStore, hooks: SqlHooks
) -> None:
    sub = await hooks.create_subscription(
        SCOPE, "http://127.0.0.1:9/a", [WebhookEvent.RUN_STARTED], "whsec_dGVzdA==", "ops"
    )
    thread = await new_thread(store)
    await start_run(store, thread.id)
    [claimed] = await hooks.claim_deliveries("d1", 5.0, 10)
    assert await hooks.claim_deliveries("d2", 5.0, 10) == []  # leased
    failed = AttemptOutcome(
        status_code=500, latency_ms=3.0, error=None, delivered=False, retry_in=0.0
    )
    assert await hooks.record_attempt(claimed, "d1", failed)
    assert not await hooks.record_attempt(claimed, "d1", failed)  # its token is spent
    [again] = await hooks.claim_deliveries("d2", 5.0, 10)
    assert again.delivery.id == claimed.delivery.id  # the same webhook-id
    dead = failed.model_copy(update={"retry_in": None})
    await hooks.record_attempt(again, "d2", dead)
    [parked] = await hooks.list_deliveries(SCOPES, sub.id, state=DeliveryState.DEAD)
    log = await hooks.delivery_attempts(SCOPES, parked.id)
    assert [(a.attempt, a.status_code, a.owner) for a in log] == [(1, 500, "d1"), (2, 500, "d2")]
    assert await hooks.claim_deliveries("d3", 5.0, 10) == []
    await hooks.redeliver(SCOPES, parked.id)
    [third] = await hooks.claim_deliveries("d3", 5.0, 10)
    ok = AttemptOutcome(status_code=204, latency_ms=1.0, error=None, delivered=True, retry_in=None)
    await hooks.record_attempt(third, "d3", ok)
    [delivered] = await hooks.list_deliveries(SCOPES, sub.id)
    assert delivered.state is DeliveryState.DELIVERED and delivered.attempts == 3
    # Disabled subscriptions record nothing new.
    await hooks.update_subscription(SCOPES, sub.id, enabled=False)
    await start_run(store, (await new_thread(store)).id)
    assert len(await hooks.list_deliveries(SCOPES, sub.id)) == 1
