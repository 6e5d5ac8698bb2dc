"""Store conformance: the scope-wide inbox (pending actions across threads) and thread scopes."""

from __future__ import annotations

from runtime.storage.store import Store
from tests.conformance.store_helpers import (
    FOREIGN,
    SCOPES,
    new_thread,
    resolution,
    start_run,
    suspend,
)


async def waiting(store: Store, *action_ids: str, scope: str = SCOPES[0]) -> str:
    thread = await new_thread(store, scope=scope)
    if scope == SCOPES[0]:
        _, lease = await start_run(store, thread.id)
    else:  # start_run submits with SCOPES
        admission = await store.submit_input(thread.id, [scope], text="hi", submitted_by="x")
        assert admission.run_id is not None
        taken = await store.acquire_run_lease(admission.run_id, "w1", 30.0)
        assert taken is not None
        await store.start_episode(taken)
        lease = taken
    await suspend(store, lease, *action_ids)
    await store.release_lease(lease)
    return thread.id


async def test_lists_pending_actions_of_the_scopes_only_with_their_thread(
    store: Store,
) -> None:
    first = await waiting(store, "act-a", "act-b")
    second = await waiting(store, "act-c")
    foreign = await waiting(store, "act-x", scope=FOREIGN[0])
    await new_thread(store)  # a thread with nothing pending is not listed
    entries = await store.pending_actions(SCOPES)
    assert sorted(e.thread_id for e in entries) == sorted([first, second])
    by_thread = {e.thread_id: e for e in entries}
    assert [a.id for a in by_thread[first].actions] == ["act-a", "act-b"]
    snapshot = await store.snapshot(first, SCOPES)
    assert by_thread[first].thread_version == snapshot.thread.version
    assert by_thread[first].actions == snapshot.pending_actions
    assert by_thread[first].scope == SCOPES[0] and by_thread[first].created_at > 0
    (other,) = await store.pending_actions(FOREIGN)
    assert other.thread_id == foreign
    assert await store.pending_actions([]) == []


async def test_pages_by_thread_and_narrows_to_threads(store: Store) -> None:
    threads = sorted([await waiting(store, f"act-{i}") for i in range(3)])
    page = await store.pending_actions(SCOPES, limit=2)
    assert [e.thread_id for e in page] == threads[:2]
    rest = await store.pending_actions(SCOPES, limit=2, after=page[-1].thread_id)
    assert [e.thread_id for e in rest] == threads[2:]
    narrowed = await store.pending_actions(SCOPES, thread_ids=[threads[1]])
    assert [e.thread_id for e in narrowed] == [threads[1]]
    assert await store.pending_actions(SCOPES, thread_ids=[]) == []


async def test_a_resolved_action_leaves_the_inbox(store: Store) -> None:
    thread_id = await waiting(store, "act-1", "act-2")
    await store.resolve_action(thread_id, SCOPES, "act-1", resolution("bob"))
    (entry,) = await store.pending_actions(SCOPES)
    assert [a.id for a in entry.actions] == ["act-2"]
    await store.resolve_action(thread_id, SCOPES, "act-2", resolution("bob"))
    assert await store.pending_actions(SCOPES) == []


async def test_thread_scopes(store: Store) -> None:
    ours = await new_thread(store)
    theirs = await new_thread(store, scope=FOREIGN[0])
    scopes = await store.thread_scopes([ours.id, theirs.id, "missing"])
    assert scopes == {ours.id: SCOPES[0], theirs.id: FOREIGN[0]}
