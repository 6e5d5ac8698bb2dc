"""Store conformance: a bounded snapshot (the default read of the API) is the whole snapshot's
last messages, with the same thread, run, queue and pending actions, hidden messages left out
unless asked for, and NotFound exactly as the whole read (on Postgres it is one statement)."""

from __future__ import annotations

import pytest

from runtime.domain import Snapshot, Visibility
from runtime.errors import NotFound
from runtime.storage.store import SetVisibility, StepCommit, Store
from tests.conformance.store_helpers import (
    FOREIGN,
    SCOPES,
    assistant,
    finish,
    new_thread,
    start_run,
    suspend,
    text,
)


def without_page(snapshot: Snapshot, keep: int) -> Snapshot:
    """`snapshot` as a bounded read of its last `keep` messages shows it (no page field)."""
    return snapshot.model_copy(update={"messages": snapshot.messages[-keep:], "page": None})


async def busy_thread(store: Store) -> str:
    """A thread with every part a snapshot shows: messages (one hidden), a queued input, a run
    waiting on an action at the tail."""
    thread = await new_thread(store, title="busy")
    _, lease = await start_run(store, thread.id, text="first")
    await store.commit(lease, StepCommit(append=(assistant(text("a")), assistant(text("b")))))
    await finish(store, lease)
    listed = await store.list_messages(thread.id)
    admin = await store.acquire_admin_lease(thread.id, "admin", 10.0)
    assert admin is not None
    await store.rewrite_history(
        admin, SetVisibility(message_id=listed[1].id, visibility=Visibility.HIDDEN)
    )
    await store.release_lease(admin)
    _, lease = await start_run(store, thread.id, text="second")
    await suspend(store, lease, "act-9")
    await store.submit_input(thread.id, SCOPES, text="queued one", submitted_by="bob")
    return thread.id


@pytest.mark.parametrize("include_hidden", [False, True])
async def test_a_bounded_snapshot_is_the_whole_ones_tail(
    store: Store, include_hidden: bool
) -> None:
    thread_id = await busy_thread(store)
    positions = {m.id: m.position for m in await store.list_messages(thread_id)}
    whole = await store.snapshot(thread_id, SCOPES, include_hidden=include_hidden)
    assert whole.run is not None and whole.queue and whole.pending_actions
    assert any(m.visibility is Visibility.HIDDEN for m in whole.messages) is include_hidden
    count = len(whole.messages)

    everything = await store.snapshot(
        thread_id, SCOPES, include_hidden=include_hidden, message_limit=count + 5
    )
    assert everything.page == {"limit": count + 5, "before": None}
    assert without_page(everything, count) == without_page(whole, count)

    last_two = await store.snapshot(
        thread_id, SCOPES, include_hidden=include_hidden, message_limit=2
    )
    assert last_two.page == {"limit": 2, "before": positions[whole.messages[-2].id]}
    assert without_page(last_two, 2) == without_page(whole, 2)

    older = await store.snapshot(
        thread_id, SCOPES, include_hidden=include_hidden, message_limit=2, before=2
    )
    assert [m.id for m in older.messages] == [m.id for m in whole.messages if positions[m.id] < 2][
        -2:
    ]
    # The pending actions are the real tail's, whatever page is read.
    assert older.pending_actions == whole.pending_actions and older.run == whole.run


async def test_a_bounded_snapshot_of_a_new_thread_and_of_a_stranger(store: Store) -> None:
    thread = await new_thread(store)
    fresh = await store.snapshot(thread.id, SCOPES, message_limit=10)
    assert fresh.messages == () and fresh.run is None and fresh.queue == ()
    assert fresh.thread == (await store.snapshot(thread.id, SCOPES)).thread
    with pytest.raises(NotFound):
        await store.snapshot(thread.id, FOREIGN, message_limit=10)
    with pytest.raises(NotFound):
        await store.snapshot("thr_missing", SCOPES, message_limit=10)
    with pytest.raises(NotFound):
        await store.snapshot(thread.id, [], message_limit=10)
