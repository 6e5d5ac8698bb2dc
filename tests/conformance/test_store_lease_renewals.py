"""Store conformance: a worker's heartbeat renews all its run leases in one call
(`renew_run_leases`), each exactly as `renew_lease` would, and reports which runs were asked to
stop."""

from __future__ import annotations

import asyncio

import pytest

from runtime.domain import Lease
from runtime.errors import InvalidInput, LeaseLost
from runtime.storage.store import Store
from tests.conformance.store_helpers import SCOPES, new_thread, queued_run, start_run

SHORT_TTL = 0.3


async def held_run(store: Store, ttl: float = 30.0) -> Lease:
    thread = await new_thread(store)
    _, lease = await start_run(store, thread.id, ttl=ttl)
    return lease


async def test_renewals_extend_every_live_lease_and_answer_in_order(store: Store) -> None:
    leases = [await held_run(store, ttl=1.0) for _ in range(3)]
    answers = await store.renew_run_leases(leases, 30.0)
    assert [a.lease.resource_id if a.lease else None for a in answers] == [
        lease.resource_id for lease in leases
    ]
    for lease, answer in zip(leases, answers, strict=True):
        assert answer.lease is not None and not answer.stop
        assert answer.lease.token == lease.token
        assert answer.lease.expires_at > lease.expires_at + 20
    # The renewed expiry is the stored one: a single renewal after it extends it again.
    again = await store.renew_lease(leases[1], 60.0)
    assert again.expires_at > answers[1].lease.expires_at + 20  # type: ignore[union-attr]
    assert await store.renew_run_leases([], 30.0) == []


async def test_a_lost_lease_is_an_answer_and_never_extends_the_new_holder(store: Store) -> None:
    kept = await held_run(store)
    released = await held_run(store)
    await store.release_lease(released)
    _, run_id = await queued_run(store)
    stale = await store.acquire_run_lease(run_id, "w1", SHORT_TTL)
    assert stale is not None
    await asyncio.sleep(SHORT_TTL + 0.2)
    expired_thread = await new_thread(store)
    _, expired = await start_run(store, expired_thread.id, ttl=SHORT_TTL)
    await asyncio.sleep(SHORT_TTL + 0.2)
    takeover = await store.acquire_run_lease(run_id, "w2", SHORT_TTL)
    assert takeover is not None and takeover.token > stale.token

    answers = await store.renew_run_leases([stale, kept, released, expired], 30.0)
    assert [a.lease is not None for a in answers] == [False, True, False, False]
    with pytest.raises(LeaseLost):
        await store.renew_lease(stale, 30.0)
    # The stale holder's renewal did not extend the new holder's lease: it expires as granted.
    await asyncio.sleep(SHORT_TTL + 0.2)
    third = await store.acquire_run_lease(run_id, "w3", 30.0)
    assert third is not None and third.token > takeover.token
    # And an expired lease stays lost, even with no one else holding it.
    with pytest.raises(LeaseLost):
        await store.renew_lease(expired, 30.0)


async def test_renewals_report_the_runs_asked_to_stop(store: Store) -> None:
    asked = await held_run(store)
    running = await held_run(store)
    await store.request_stop(asked.thread_id, SCOPES, asked.resource_id)
    answers = await store.renew_run_leases([asked, running], 30.0)
    assert [a.stop for a in answers] == [True, False]
    assert all(a.lease is not None for a in answers)  # a stop request keeps the lease


async def test_renewals_of_more_leases_than_one_statement_holds(store: Store) -> None:
    # 503: more than the SQL stores' 500 leases per statement.
    leases = [await held_run(store, ttl=5.0) for _ in range(503)]
    await store.release_lease(leases[501])
    answers = await store.renew_run_leases(leases, 30.0)
    assert [i for i, a in enumerate(answers) if a.lease is None] == [501]
    for answer, lease in zip(answers, leases, strict=True):
        assert answer.lease is None or answer.lease.expires_at > lease.expires_at + 20


async def test_renewals_take_only_run_leases(store: Store) -> None:
    thread = await new_thread(store)
    admin = await store.acquire_admin_lease(thread.id, "admin-1", 10.0)
    assert admin is not None
    with pytest.raises(InvalidInput):
        await store.renew_run_leases([admin], 30.0)
    with pytest.raises(InvalidInput):
        await store.renew_run_leases([await held_run(store)], 0)
