"""Store conformance: run/admin leases on the database clock, fencing, episodes, runnable runs."""

from __future__ import annotations

import asyncio

import pytest

from runtime.domain import Lease, LeaseKind, RunStatus, Visibility
from runtime.errors import InvalidInput, LeaseLost
from runtime.storage.store import (
    RunChange,
    SetVisibility,
    StepCommit,
    Store,
    TailUpdate,
    Truncate,
)
from tests.conformance.store_helpers import (
    SCOPES,
    assistant,
    finish,
    new_thread,
    queued_run,
    start_run,
    suspend,
    text,
)

SHORT_TTL = 0.3


# --- acquire / renew / release ------------------------------------------------------------


async def test_acquire_run_lease(store: Store) -> None:
    thread_id, run_id = await queued_run(store)
    before = await store.db_time()
    lease = await store.acquire_run_lease(run_id, "w1", 10.0)
    assert lease is not None
    assert (lease.kind, lease.resource_id, lease.thread_id, lease.owner) == (
        LeaseKind.RUN,
        run_id,
        thread_id,
        "w1",
    )
    assert before + 9.0 < lease.expires_at < before + 11.0
    # A live lease excludes everybody, its owner included.
    assert await store.acquire_run_lease(run_id, "w2", 10.0) is None
    assert await store.acquire_run_lease(run_id, "w1", 10.0) is None
    # Leases are not part of a snapshot: no version bump.
    assert (await store.get_thread(thread_id, SCOPES)).version == 2


async def test_fencing_tokens_increase_across_resources(store: Store) -> None:
    tokens = []
    for _ in range(3):
        _, run_id = await queued_run(store)
        lease = await store.acquire_run_lease(run_id, "w", 10.0)
        assert lease is not None
        tokens.append(lease.token)
        await store.release_lease(lease)
        again = await store.acquire_run_lease(run_id, "w", 10.0)
        assert again is not None
        tokens.append(again.token)
    assert tokens == sorted(set(tokens))


async def test_no_run_lease_for_terminal_or_plain_waiting_runs(store: Store) -> None:
    thread = await new_thread(store)
    admission, lease = await start_run(store, thread.id)
    await suspend(store, lease)
    await store.release_lease(lease)
    run_id = admission.run_id or ""
    assert await store.acquire_run_lease(run_id, "w2", 10.0) is None
    await store.request_stop(thread.id, SCOPES, run_id)
    stopper = await store.acquire_run_lease(run_id, "w2", 10.0)
    assert stopper is not None  # waiting with a stop request: a worker must finalise it
    await finish(store, stopper, RunStatus.CANCELLED)
    await store.release_lease(stopper)
    assert await store.acquire_run_lease(run_id, "w3", 10.0) is None


async def test_admin_lease_excludes_admins_and_run_leases(store: Store) -> None:
    thread_id, run_id = await queued_run(store)
    admin = await store.acquire_admin_lease(thread_id, "admin-1", 10.0)
    assert admin is not None and admin.kind is LeaseKind.ADMIN
    assert admin.resource_id == thread_id == admin.thread_id
    assert await store.acquire_admin_lease(thread_id, "admin-2", 10.0) is None
    assert await store.acquire_run_lease(run_id, "w1", 10.0) is None
    assert await store.find_runnable_runs() == []
    await store.release_lease(admin)
    assert [r.id for r in await store.find_runnable_runs()] == [run_id]
    assert await store.acquire_run_lease(run_id, "w1", 10.0) is not None


async def test_renew_extends_and_release_frees(store: Store) -> None:
    _, run_id = await queued_run(store)
    lease = await store.acquire_run_lease(run_id, "w1", 1.0)
    assert lease is not None
    renewed = await store.renew_lease(lease, 30.0)
    assert renewed.token == lease.token and renewed.expires_at > lease.expires_at + 20
    await store.release_lease(renewed)
    with pytest.raises(LeaseLost):
        await store.renew_lease(renewed, 30.0)
    assert await store.acquire_run_lease(run_id, "w2", 10.0) is not None


async def test_terminal_commit_releases_the_run_lease(store: Store) -> None:
    for status in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED):
        thread = await new_thread(store)
        admission, lease = await start_run(store, thread.id)
        step = await store.commit(lease, StepCommit(append=(assistant(text("a")),)))
        assert not step.released
        ended = await finish(store, lease, status)
        # In the terminal commit's own transaction: no lease row is left, nothing to release.
        assert ended.released
        with pytest.raises(LeaseLost):
            await store.renew_lease(lease, 30.0)
        await store.release_lease(lease)  # a release after it deletes nothing, raises nothing
        assert (await store.get_run(admission.run_id or "")).status is status


async def test_waiting_commit_keeps_the_run_lease(store: Store) -> None:
    thread = await new_thread(store)
    _, lease = await start_run(store, thread.id)
    waiting = await suspend(store, lease, "act-1")
    assert not waiting.released
    assert (await store.renew_lease(lease, 30.0)).token == lease.token


async def test_release_of_a_stale_lease_keeps_the_new_owner(store: Store) -> None:
    _, run_id = await queued_run(store)
    old = await store.acquire_run_lease(run_id, "w1", SHORT_TTL)
    assert old is not None
    await asyncio.sleep(SHORT_TTL + 0.2)
    new = await store.acquire_run_lease(run_id, "w2", 30.0)
    assert new is not None and new.token > old.token
    await store.release_lease(old)
    assert await store.renew_lease(new, 30.0)
    assert await store.acquire_run_lease(run_id, "w3", 30.0) is None


async def test_lease_expiry_follows_the_database_clock(store: Store) -> None:
    _, run_id = await queued_run(store)
    lease = await store.acquire_run_lease(run_id, "w1", SHORT_TTL)
    assert lease is not None
    assert await store.acquire_run_lease(run_id, "w2", SHORT_TTL) is None
    await asyncio.sleep(SHORT_TTL + 0.2)
    assert await store.db_time() > lease.expires_at
    takeover = await store.acquire_run_lease(run_id, "w2", 30.0)
    assert takeover is not None and takeover.owner == "w2" and takeover.token > lease.token
    with pytest.raises(LeaseLost):
        await store.renew_lease(lease, 30.0)


async def test_expired_lease_cannot_be_renewed_even_without_takeover(store: Store) -> None:
    _, run_id = await queued_run(store)
    lease = await store.acquire_run_lease(run_id, "w1", SHORT_TTL)
    assert lease is not None
    await asyncio.sleep(SHORT_TTL + 0.2)
    with pytest.raises(LeaseLost):
        await store.renew_lease(lease, 30.0)


async def test_lease_arguments_are_validated(store: Store) -> None:
    _, run_id = await queued_run(store)
    for ttl in (0, -1, float("nan"), float("inf")):
        with pytest.raises(InvalidInput):
            await store.acquire_run_lease(run_id, "w1", ttl)
    with pytest.raises(InvalidInput):
        await store.acquire_run_lease(run_id, "", 1.0)


# --- fencing ------------------------------------------------------------------------------


async def test_fenced_writes_after_takeover_fail_and_change_nothing(store: Store) -> None:
    thread = await new_thread(store)
    admission, old = await start_run(store, thread.id, ttl=SHORT_TTL)
    await store.commit(old, StepCommit(append=(assistant(text("step 1")),)))
    await asyncio.sleep(SHORT_TTL + 0.2)
    new = await store.acquire_run_lease(admission.run_id or "", "w2", 30.0)
    assert new is not None
    before = await store.snapshot(thread.id, SCOPES)
    run_before = await store.get_run(admission.run_id or "")
    tail = (await store.list_messages(thread.id))[-1]
    attempts = [
        StepCommit(append=(assistant(text("zombie")),)),
        StepCommit(update_tail=TailUpdate(message_id=tail.id, parts=(text("zombie"),))),
        StepCommit(run=RunChange(status=RunStatus.COMPLETED)),
        StepCommit(next_seq=99),
    ]
    for attempt in attempts:
        with pytest.raises(LeaseLost) as caught:
            await store.commit(old, attempt)
        assert caught.value.code == "lease_lost"
    with pytest.raises(LeaseLost):
        await store.start_episode(old)
    assert await store.snapshot(thread.id, SCOPES) == before
    assert await store.get_run(admission.run_id or "") == run_before
    # The new owner writes fine.
    redo = await store.commit(new, StepCommit(append=(assistant(text("redo")),)))
    assert redo.version == before.thread.version + 1


async def test_forged_or_mismatched_leases_are_lost(store: Store) -> None:
    thread = await new_thread(store)
    other = await new_thread(store)
    _, lease = await start_run(store, thread.id)
    forged = [
        lease.model_copy(update={"token": lease.token + 100}),
        lease.model_copy(update={"thread_id": other.id}),
        lease.model_copy(update={"resource_id": "run_unknown"}),
        lease.model_copy(update={"thread_id": "th_unknown"}),
    ]
    for bad in forged:
        with pytest.raises(LeaseLost):
            await store.commit(bad, StepCommit(append=(assistant(text("x")),)))
    with pytest.raises(InvalidInput):
        await store.commit(
            lease.model_copy(update={"kind": LeaseKind.ADMIN}),
            StepCommit(append=(assistant(text("x")),)),
        )
    assert len(await store.list_messages(thread.id)) == 1


async def test_admin_lease_fences_rewrites(store: Store) -> None:
    thread = await new_thread(store)
    _, lease = await start_run(store, thread.id)
    await store.commit(lease, StepCommit(append=(assistant(text("a")),)))
    await finish(store, lease)
    messages = await store.list_messages(thread.id)
    admin = await store.acquire_admin_lease(thread.id, "admin", SHORT_TTL)
    assert admin is not None
    await asyncio.sleep(SHORT_TTL + 0.2)
    before = await store.snapshot(thread.id, SCOPES)
    with pytest.raises(LeaseLost):
        await store.rewrite_history(admin, Truncate(from_message_id=messages[1].id, started_by="x"))
    with pytest.raises(LeaseLost):
        await store.rewrite_history(
            Lease(
                kind=LeaseKind.ADMIN,
                resource_id=thread.id,
                thread_id=thread.id,
                owner="x",
                token=admin.token + 1000,
                expires_at=admin.expires_at + 100,
            ),
            SetVisibility(message_id=messages[1].id, visibility=Visibility.HIDDEN),
        )
    assert await store.snapshot(thread.id, SCOPES) == before


# --- episodes -----------------------------------------------------------------------------


async def test_start_episode_moves_queued_to_running(store: Store) -> None:
    thread_id, run_id = await queued_run(store)
    lease = await store.acquire_run_lease(run_id, "w1", 10.0)
    assert lease is not None
    run, version = await store.start_episode(lease)
    assert (run.status, run.episode, version) == (RunStatus.RUNNING, 1, 3)
    snapshot = await store.snapshot(thread_id, SCOPES)
    assert snapshot.run is not None and snapshot.run.status is RunStatus.RUNNING


async def test_takeover_episode_keeps_running_without_bump(store: Store) -> None:
    thread = await new_thread(store)
    admission, old = await start_run(store, thread.id, ttl=SHORT_TTL)
    version = (await store.get_thread(thread.id, SCOPES)).version
    await asyncio.sleep(SHORT_TTL + 0.2)
    assert [r.id for r in await store.find_runnable_runs()] == [admission.run_id]
    new = await store.acquire_run_lease(admission.run_id or "", "w2", 10.0)
    assert new is not None and old.token < new.token
    run, current = await store.start_episode(new)
    assert (run.status, run.episode, current) == (RunStatus.RUNNING, 2, version)


async def test_episode_of_stopped_waiting_run_stays_waiting(store: Store) -> None:
    thread = await new_thread(store)
    admission, lease = await start_run(store, thread.id)
    await suspend(store, lease)
    await store.release_lease(lease)
    await store.request_stop(thread.id, SCOPES, admission.run_id or "")
    stopper = await store.acquire_run_lease(admission.run_id or "", "w2", 10.0)
    assert stopper is not None
    run, _ = await store.start_episode(stopper)
    assert run.status is RunStatus.WAITING and run.stop_requested and run.episode == 2


async def test_stop_of_queued_run_under_live_lease_is_left_to_its_worker(store: Store) -> None:
    thread_id, run_id = await queued_run(store)
    lease = await store.acquire_run_lease(run_id, "w1", 10.0)
    assert lease is not None
    result = await store.request_stop(thread_id, SCOPES, run_id)
    assert result.status is RunStatus.QUEUED
    run, _ = await store.start_episode(lease)
    assert run.status is RunStatus.RUNNING and run.stop_requested
    await finish(store, lease, RunStatus.CANCELLED)
    assert not (await store.get_run(run_id)).stop_requested


# --- runnable runs ------------------------------------------------------------------------


async def test_find_runnable_runs(store: Store) -> None:
    _, queued_id = await queued_run(store)
    leased_thread = await new_thread(store)
    leased, _ = await start_run(store, leased_thread.id)
    waiting_thread = await new_thread(store)
    waiting, wlease = await start_run(store, waiting_thread.id)
    await suspend(store, wlease)
    await store.release_lease(wlease)
    _, unleased_id = await queued_run(store)
    done_thread = await new_thread(store)
    _, dlease = await start_run(store, done_thread.id)
    await finish(store, dlease)
    await store.release_lease(dlease)
    runnable = [r.id for r in await store.find_runnable_runs()]
    assert runnable == [queued_id, unleased_id]  # oldest first
    assert [r.id for r in await store.find_runnable_runs(limit=1)] == [queued_id]
    await store.request_stop(waiting_thread.id, SCOPES, waiting.run_id or "")
    assert waiting.run_id in [r.id for r in await store.find_runnable_runs()]
    assert leased.run_id not in [r.id for r in await store.find_runnable_runs()]
