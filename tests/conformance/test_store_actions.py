"""Store conformance: resolving pending actions (exactly one winner) and history rewrites."""

from __future__ import annotations

import asyncio

import pytest

from runtime.domain import MAX_METADATA_BYTES, Lease, Role, RunStatus, RunTrigger, Visibility
from runtime.errors import (
    ActionConflict,
    Forbidden,
    InvalidInput,
    NotFound,
    RunActive,
    TooLarge,
    VersionMismatch,
)
from runtime.storage.store import SetVisibility, StepCommit, Store, Truncate
from tests.conformance.store_helpers import (
    SCOPES,
    assistant,
    finish,
    new_thread,
    resolution,
    start_run,
    suspend,
    text,
)


async def waiting_thread(store: Store, *action_ids: str) -> tuple[str, str, Lease]:
    thread = await new_thread(store)
    admission, lease = await start_run(store, thread.id)
    await suspend(store, lease, *action_ids)
    await store.release_lease(lease)
    return thread.id, admission.run_id or "", lease


# --- resolve_action -----------------------------------------------------------------------


async def test_resolving_the_last_action_resumes_the_run(store: Store) -> None:
    thread_id, run_id, _ = await waiting_thread(store, "act-1")
    before = await store.snapshot(thread_id, SCOPES)
    result = await store.resolve_action(thread_id, SCOPES, "act-1", resolution("bob"))
    assert (result.run_id, result.run_resumed) == (run_id, True)
    assert result.version == before.thread.version + 1
    snapshot = await store.snapshot(thread_id, SCOPES)
    assert snapshot.pending_actions == () and snapshot.run is not None
    assert snapshot.run.status is RunStatus.RUNNING
    part = (await store.list_messages(thread_id))[-1].parts[-1]
    assert part.type == "tool-call" and part.waiting is not None
    assert part.waiting.resolution == resolution("bob")
    assert part.state.value == "awaiting-action"  # the worker moves it on
    assert [r.id for r in await store.find_runnable_runs()] == [run_id]


async def test_run_waits_until_every_action_is_resolved(store: Store) -> None:
    thread_id, _, _ = await waiting_thread(store, "act-1", "act-2")
    first = await store.resolve_action(thread_id, SCOPES, "act-1", resolution())
    assert not first.run_resumed
    snapshot = await store.snapshot(thread_id, SCOPES)
    assert [a.id for a in snapshot.pending_actions] == ["act-2"]
    assert snapshot.run is not None and snapshot.run.status is RunStatus.WAITING
    second = await store.resolve_action(thread_id, SCOPES, "act-2", resolution())
    assert second.run_resumed and second.version == first.version + 1


async def test_second_resolution_conflicts_naming_the_winner(store: Store) -> None:
    thread_id, _, _ = await waiting_thread(store, "act-1")
    await store.resolve_action(thread_id, SCOPES, "act-1", resolution("alice"))
    version = (await store.get_thread(thread_id, SCOPES)).version
    with pytest.raises(ActionConflict) as caught:
        await store.resolve_action(thread_id, SCOPES, "act-1", resolution("bob", Role.BACKEND))
    assert caught.value.code == "conflict" and "alice" in caught.value.message
    assert caught.value.details == {"resolved_by": "alice", "state": "awaiting-action"}
    assert (await store.get_thread(thread_id, SCOPES)).version == version


async def test_concurrent_resolutions_have_exactly_one_winner(store: Store) -> None:
    thread_id, _, _ = await waiting_thread(store, "act-1")
    version = (await store.get_thread(thread_id, SCOPES)).version
    subjects = [f"user-{index}" for index in range(10)]
    results = await asyncio.gather(
        *(store.resolve_action(thread_id, SCOPES, "act-1", resolution(s)) for s in subjects),
        return_exceptions=True,
    )
    winners = [s for s, r in zip(subjects, results, strict=True) if not isinstance(r, Exception)]
    assert len(winners) == 1, results
    losers = [r for r in results if isinstance(r, Exception)]
    assert all(isinstance(r, ActionConflict) for r in losers), losers
    assert all(
        isinstance(r, ActionConflict) and r.details["resolved_by"] == winners[0] for r in losers
    )
    assert (await store.get_thread(thread_id, SCOPES)).version == version + 1


async def test_role_not_allowed_is_forbidden(store: Store) -> None:
    thread_id, _, _ = await waiting_thread(store, "act-1")  # allowed: user, backend
    version = (await store.get_thread(thread_id, SCOPES)).version
    with pytest.raises(Forbidden):
        await store.resolve_action(thread_id, SCOPES, "act-1", resolution("root", Role.ADMIN))
    assert (await store.get_thread(thread_id, SCOPES)).version == version
    assert len((await store.snapshot(thread_id, SCOPES)).pending_actions) == 1


async def test_expected_version_mismatch(store: Store) -> None:
    thread_id, _, _ = await waiting_thread(store, "act-1")
    version = (await store.get_thread(thread_id, SCOPES)).version
    with pytest.raises(VersionMismatch) as caught:
        await store.resolve_action(
            thread_id, SCOPES, "act-1", resolution(), expected_version=version - 1
        )
    assert caught.value.code == "conflict"
    assert caught.value.details == {"current_version": version}
    result = await store.resolve_action(
        thread_id, SCOPES, "act-1", resolution(), expected_version=version
    )
    assert result.version == version + 1


async def test_unknown_action_is_not_found(store: Store) -> None:
    thread_id, _, _ = await waiting_thread(store, "act-1")
    with pytest.raises(NotFound):
        await store.resolve_action(thread_id, SCOPES, "act-unknown", resolution())
    # LIKE wildcards in the id match nothing by accident.
    with pytest.raises(NotFound):
        await store.resolve_action(thread_id, SCOPES, "act-%", resolution())


async def test_action_no_longer_in_the_tail_conflicts(store: Store) -> None:
    thread = await new_thread(store)
    admission, lease = await start_run(store, thread.id)
    await suspend(store, lease, "act_1")
    await store.request_stop(thread.id, SCOPES, admission.run_id or "")
    await finish(store, lease, RunStatus.CANCELLED)
    await store.submit_input(thread.id, SCOPES, text="moving on", submitted_by="alice")
    with pytest.raises(ActionConflict) as caught:
        await store.resolve_action(thread.id, SCOPES, "act_1", resolution())
    assert caught.value.details == {"resolved_by": None, "state": "cancelled"}


# --- rewrite_history ----------------------------------------------------------------------


async def finished_conversation(store: Store) -> tuple[str, list[str]]:
    """user "q1", assistant "a1", user "q2", assistant "a2"; no active run."""
    thread = await store.create_thread("acme", "t", {"keep": 1, "swap": "old"}, {"p": 1})
    _, lease = await start_run(store, thread.id, text="q1")
    await store.commit(lease, StepCommit(append=(assistant(text("a1")),)))
    await finish(store, lease)
    _, lease = await start_run(store, thread.id, text="q2")
    await store.commit(lease, StepCommit(append=(assistant(text("a2")),)))
    await finish(store, lease)
    return thread.id, [m.id for m in await store.list_messages(thread.id)]


async def admin_lease(store: Store, thread_id: str) -> Lease:
    lease = await store.acquire_admin_lease(thread_id, "admin", 10.0)
    assert lease is not None
    return lease


async def test_truncate_regenerates_from_last_user_message(store: Store) -> None:
    thread_id, ids = await finished_conversation(store)
    version = (await store.get_thread(thread_id, SCOPES)).version
    result = await store.rewrite_history(
        await admin_lease(store, thread_id),
        Truncate(from_message_id=ids[3], started_by="admin-bob"),
        public_patch={"swap": "new"},
        private_patch={"q": 2},
    )
    assert result.version == version + 1 and result.removed_message_ids == (ids[3],)
    run = await store.get_run(result.run_id or "")
    assert (run.status, run.trigger, run.started_by, run.input_message_id) == (
        RunStatus.QUEUED,
        RunTrigger.REGENERATE,
        "admin-bob",
        ids[2],
    )
    assert [m.id for m in await store.list_messages(thread_id)] == ids[:3]
    thread = await store.get_thread(thread_id, SCOPES)
    assert thread.metadata == {"keep": 1, "swap": "new"}
    assert thread.private_metadata == {"p": 1, "q": 2}
    snapshot = await store.snapshot(thread_id, SCOPES)
    assert snapshot.run is not None and snapshot.run.id == result.run_id


async def test_truncate_from_a_user_message_uses_the_previous_one(store: Store) -> None:
    thread_id, ids = await finished_conversation(store)
    result = await store.rewrite_history(
        await admin_lease(store, thread_id), Truncate(from_message_id=ids[2], started_by="x")
    )
    assert result.removed_message_ids == (ids[2], ids[3])
    assert (await store.get_run(result.run_id or "")).input_message_id == ids[0]


async def test_truncate_errors_change_nothing(store: Store) -> None:
    thread_id, ids = await finished_conversation(store)
    lease = await admin_lease(store, thread_id)
    before = await store.snapshot(thread_id, SCOPES)
    with pytest.raises(NotFound):
        await store.rewrite_history(lease, Truncate(from_message_id="msg_unknown", started_by="x"))
    with pytest.raises(InvalidInput):  # no user message would remain
        await store.rewrite_history(lease, Truncate(from_message_id=ids[0], started_by="x"))
    with pytest.raises(TooLarge):
        await store.rewrite_history(
            lease,
            SetVisibility(message_id=ids[1], visibility=Visibility.HIDDEN),
            public_patch={"blob": "x" * MAX_METADATA_BYTES},
        )
    assert await store.snapshot(thread_id, SCOPES) == before


async def test_rewrite_refused_while_a_run_is_active(store: Store) -> None:
    thread_id, ids = await finished_conversation(store)
    await store.submit_input(thread_id, SCOPES, text="q3", submitted_by="alice")
    lease = await admin_lease(store, thread_id)
    before = await store.snapshot(thread_id, SCOPES)
    with pytest.raises(RunActive):
        await store.rewrite_history(lease, Truncate(from_message_id=ids[3], started_by="x"))
    with pytest.raises(RunActive):
        await store.rewrite_history(
            lease, SetVisibility(message_id=ids[1], visibility=Visibility.HIDDEN)
        )
    assert await store.snapshot(thread_id, SCOPES) == before


async def test_set_visibility_and_metadata_patches(store: Store) -> None:
    thread_id, ids = await finished_conversation(store)
    lease = await admin_lease(store, thread_id)
    version = (await store.get_thread(thread_id, SCOPES)).version
    result = await store.rewrite_history(
        lease,
        SetVisibility(message_id=ids[1], visibility=Visibility.HIDDEN),
        public_patch={"hidden": [ids[1]]},
    )
    assert result.version == version + 1 and result.run_id is None
    snapshot = await store.snapshot(thread_id, SCOPES)
    assert [m.id for m in snapshot.messages] == [ids[0], ids[2], ids[3]]
    assert snapshot.thread.metadata == {"keep": 1, "swap": "old", "hidden": [ids[1]]}
    await store.rewrite_history(
        lease, SetVisibility(message_id=ids[1], visibility=Visibility.VISIBLE)
    )
    assert len((await store.snapshot(thread_id, SCOPES)).messages) == 4
    other = await new_thread(store)
    other_messages = await finished_conversation(store)
    with pytest.raises(NotFound):  # a message of another thread
        await store.rewrite_history(
            lease, SetVisibility(message_id=other_messages[1][0], visibility=Visibility.HIDDEN)
        )
    assert other.id != thread_id


async def test_rewrite_needs_an_admin_lease(store: Store) -> None:
    thread = await new_thread(store)
    _, run_lease = await start_run(store, thread.id)
    with pytest.raises(InvalidInput):
        await store.rewrite_history(
            run_lease, SetVisibility(message_id="m", visibility=Visibility.HIDDEN)
        )
