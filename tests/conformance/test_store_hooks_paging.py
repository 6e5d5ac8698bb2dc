"""Cursor paging of schedules, webhook subscriptions, a schedule's fires and a webhook's
deliveries, on both backends: pages follow each other without repeats or gaps, rows added
meanwhile included once, other scopes' rows never."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from runtime.errors import InvalidInput
from runtime.storage import SqlStore
from runtime.storage.hooks_store import (
    Delivery,
    MissedFire,
    Schedule,
    ScheduleFire,
    ScheduleSpec,
    WebhookEvent,
    WebhookSubscription,
    created_cursor,
    delivery_cursor,
    fire_cursor,
)
from runtime.storage.sql.hooks_sql import SqlHooks
from tests.conformance.store_helpers import FOREIGN, SCOPE, SCOPES, new_thread

MAX_PAGES = 50  # a bound on following cursors


@pytest.fixture
async def hooks(sql_store: SqlStore) -> AsyncIterator[SqlHooks]:
    yield SqlHooks(sql_store)


async def _send(store: SqlStore, n: int) -> None:
    for i in range(n):
        thread = await new_thread(store, f"t{i}")
        await store.submit_input(thread.id, SCOPES, text=f"hi {i}", submitted_by="alice")


async def test_deliveries_page_by_cursor_while_events_arrive(
    sql_store: SqlStore, hooks: SqlHooks
) -> None:
    sub = await hooks.create_subscription(
        SCOPE, "http://127.0.0.1:9/a", [WebhookEvent.MESSAGE_COMMITTED], "whsec_dGVzdA==", "ops"
    )
    await _send(sql_store, 5)
    seen: list[Delivery] = []
    after: str | None = None
    for page_number in range(MAX_PAGES):
        page = await hooks.list_deliveries(SCOPES, sub.id, limit=2, after=after)
        seen += page
        if page_number == 0:
            await _send(sql_store, 3)  # newer events: they sort after every page read so far
        if len(page) < 2:
            break
        after = delivery_cursor(page[-1])
    everything = await hooks.list_deliveries(SCOPES, sub.id, limit=500)
    assert len(everything) == 8
    assert [d.id for d in seen] == [d.id for d in everything]


async def test_fires_page_newest_first_by_cursor(sql_store: SqlStore, hooks: SqlHooks) -> None:
    thread = await new_thread(sql_store)
    schedule = await hooks.create_schedule(
        ScheduleSpec(
            scope=SCOPE,
            thread_id=thread.id,
            cron="* * * * * *",  # every second (cronsim: seconds first)
            text="tick",
            missed=MissedFire.RUN_ONCE,
            misfire_grace=60.0,  # late fires are caught up one by one
        ),
        "alice",
    )
    assert schedule.next_fire_at is not None
    due = schedule.next_fire_at + 3.0
    await asyncio.sleep(max(0.0, due - await sql_store.db_time()) + 0.05)
    for _ in range(20):  # bounded: each round fires the next caught-up time
        timers = await hooks.claim_timers("w1", 5.0, 10)
        if not timers:
            break
        for timer in timers:
            await hooks.fire_timer(timer)
    everything = await hooks.schedule_fires(SCOPES, schedule.id, limit=500)
    assert len(everything) >= 4
    seen: list[ScheduleFire] = []
    after: str | None = None
    for _ in range(MAX_PAGES):
        page = await hooks.schedule_fires(SCOPES, schedule.id, limit=3, after=after)
        seen += page
        if len(page) < 3:
            break
        after = fire_cursor(page[-1])
    assert [f.fire_at for f in seen] == [f.fire_at for f in everything]
    assert [f.fire_at for f in seen] == sorted((f.fire_at for f in seen), reverse=True)


async def test_schedules_and_subscriptions_page_oldest_first_within_the_scopes(
    sql_store: SqlStore, hooks: SqlHooks
) -> None:
    thread = await new_thread(sql_store)
    foreign = await new_thread(sql_store, scope=FOREIGN[0])

    async def schedule(scope: str, thread_id: str) -> Schedule:
        spec = ScheduleSpec(scope=scope, thread_id=thread_id, cron="0 0 * * *", text="x")
        return await hooks.create_schedule(spec, "alice")

    async def subscription(scope: str) -> WebhookSubscription:
        events = [WebhookEvent.RUN_COMPLETED]
        return await hooks.create_subscription(
            scope, "http://127.0.0.1:9/a", events, "whsec_dGVzdA==", "ops"
        )

    await schedule(FOREIGN[0], foreign.id)
    await subscription(FOREIGN[0])
    for _ in range(5):
        await schedule(SCOPE, thread.id)
        await subscription(SCOPE)
    schedules: list[Schedule] = []
    subscriptions: list[WebhookSubscription] = []
    after_schedule: str | None = None
    after_subscription: str | None = None
    for page_number in range(MAX_PAGES):
        schedule_page = await hooks.list_schedules(SCOPES, limit=2, after=after_schedule)
        subscription_page = await hooks.list_subscriptions(
            SCOPES, limit=2, after=after_subscription
        )
        schedules += schedule_page
        subscriptions += subscription_page
        if page_number == 0:  # created meanwhile: newer than every page read so far
            await schedule(SCOPE, thread.id)
            await subscription(SCOPE)
        if len(schedule_page) < 2 and len(subscription_page) < 2:
            break
        if schedule_page:
            after_schedule = created_cursor(schedule_page[-1])
        if subscription_page:
            after_subscription = created_cursor(subscription_page[-1])
    all_schedules = await hooks.list_schedules(SCOPES, limit=500)
    all_subscriptions = await hooks.list_subscriptions(SCOPES, limit=500)
    assert len(all_schedules) == len(all_subscriptions) == 6
    assert [s.id for s in schedules] == [s.id for s in all_schedules]
    assert [s.id for s in subscriptions] == [s.id for s in all_subscriptions]
    assert {s.scope for s in schedules} == {s.scope for s in subscriptions} == {SCOPE}


@pytest.mark.parametrize("cursor", ["nope", "WzEsMl0", "e30"])
async def test_a_cursor_the_server_did_not_give_is_invalid_input(
    sql_store: SqlStore, hooks: SqlHooks, cursor: str
) -> None:
    sub = await hooks.create_subscription(
        SCOPE, "http://127.0.0.1:9/a", list(WebhookEvent), "whsec_dGVzdA==", "ops"
    )
    with pytest.raises(InvalidInput):
        await hooks.list_deliveries(SCOPES, sub.id, after=cursor)
    thread = await new_thread(sql_store)
    schedule = await hooks.create_schedule(
        ScheduleSpec(scope=SCOPE, thread_id=thread.id, cron="0 0 * * *", text="x"), "alice"
    )
    with pytest.raises(InvalidInput):
        await hooks.schedule_fires(SCOPES, schedule.id, after=cursor)
    with pytest.raises(InvalidInput):
        await hooks.list_schedules(SCOPES, after=cursor)
    with pytest.raises(InvalidInput):
        await hooks.list_subscriptions(SCOPES, after=cursor)
