"""Store conformance: `act` commits resolutions, stops and a user message whole, or nothing."""

from __future__ import annotations

import asyncio

import pytest

from runtime.domain import InputPolicy, RunStatus
from runtime.errors import ActionConflict, QueueFull, RunActive
from runtime.storage.store import AdmissionLimits, InputOp, ResolveOp, StopOp, Store
from tests.conformance.store_helpers import (
    SCOPES,
    new_thread,
    resolution,
    start_run,
    suspend,
)

ONE_QUEUED = AdmissionLimits(queue_max_items=1)


async def waiting_thread(store: Store, *action_ids: str) -> tuple[str, str]:
    """A thread whose run waits on `action_ids` (its lease released, as a worker leaves it)."""
    thread = await new_thread(store)
    admission, lease = await start_run(store, thread.id)
    await suspend(store, lease, *action_ids)
    await store.release_lease(lease)
    return thread.id, admission.run_id or ""


def said(text: str) -> InputOp:
    return InputOp(text=text, submitted_by="alice", client_request_id=f"req-{text}")


async def state(store: Store, thread_id: str) -> object:
    """Everything an act may change: the snapshot (version, messages, run, actions, queue)."""
    return (await store.snapshot(thread_id, SCOPES, include_hidden=True)).model_dump()


async def test_an_act_resolves_and_queues_in_one_version(store: Store) -> None:
    thread_id, run_id = await waiting_thread(store, "act-1")
    version = (await store.get_thread(thread_id, SCOPES)).version
    result = await store.act(
        thread_id,
        SCOPES,
        [ResolveOp(action_id="act-1", resolution=resolution()), said("and then this")],
        ONE_QUEUED,
    )
    assert result.changed and result.version == version + 1
    assert [(r.run_id, r.run_resumed, r.version) for r in result.resolved] == [
        (run_id, True, version + 1)
    ]
    assert result.admission is not None and result.admission.queued_item_id is not None
    assert result.admission.version == version + 1
    snapshot = await store.snapshot(thread_id, SCOPES)
    assert snapshot.pending_actions == ()
    assert snapshot.run is not None and snapshot.run.status is RunStatus.RUNNING
    assert [item.text for item in snapshot.queue] == ["and then this"]


async def test_a_message_refused_at_commit_leaves_the_action_pending(store: Store) -> None:
    thread_id, _ = await waiting_thread(store, "act-1")
    await store.submit_input(
        thread_id, SCOPES, text="fills the queue", submitted_by="alice", limits=ONE_QUEUED
    )
    before = await state(store, thread_id)
    with pytest.raises(QueueFull):
        await store.act(
            thread_id,
            SCOPES,
            [ResolveOp(action_id="act-1", resolution=resolution()), said("one too many")],
            ONE_QUEUED,
        )
    assert await state(store, thread_id) == before
    assert [a.id for a in (await store.snapshot(thread_id, SCOPES)).pending_actions] == ["act-1"]


async def test_a_stale_resolution_later_in_the_act_undoes_the_earlier_ones(store: Store) -> None:
    thread_id, _ = await waiting_thread(store, "act-1", "act-2")
    before = await state(store, thread_id)
    first = ResolveOp(action_id="act-1", resolution=resolution())
    with pytest.raises(ActionConflict):
        await store.act(thread_id, SCOPES, [first, first], None)
    assert await state(store, thread_id) == before


async def test_a_stop_is_undone_with_a_refused_message(store: Store) -> None:
    thread_id, run_id = await waiting_thread(store, "act-1")
    await store.submit_input(thread_id, SCOPES, text="queued", submitted_by="alice")
    before = await state(store, thread_id)
    # The stop cancels the waiting run and admits the queued input as the next run: a message
    # with policy `reject` then finds a run active, and the stop goes back with it.
    refused = InputOp(text="now", submitted_by="alice", policy=InputPolicy.REJECT)
    with pytest.raises(RunActive):
        await store.act(thread_id, SCOPES, [StopOp(run_id=run_id), refused], None)
    assert await state(store, thread_id) == before
    run = await store.get_run(run_id)
    assert run.status is RunStatus.WAITING


async def test_racing_acts_on_one_action_one_wins_whole(store: Store) -> None:
    thread_id, _ = await waiting_thread(store, "act-1")
    version = (await store.get_thread(thread_id, SCOPES)).version
    texts = [f"from client {n}" for n in range(4)]
    results = await asyncio.gather(
        *(
            store.act(
                thread_id,
                SCOPES,
                [ResolveOp(action_id="act-1", resolution=resolution(f"u{n}")), said(t)],
                None,
            )
            for n, t in enumerate(texts)
        ),
        return_exceptions=True,
    )
    won = [t for t, r in zip(texts, results, strict=True) if not isinstance(r, BaseException)]
    assert len(won) == 1, results
    assert all(isinstance(r, ActionConflict) for r in results if isinstance(r, BaseException))
    snapshot = await store.snapshot(thread_id, SCOPES)
    # The winner's message alone, and one version for its whole act.
    assert [item.text for item in snapshot.queue] == won
    assert snapshot.thread.version == version + 1
