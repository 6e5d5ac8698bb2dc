"""Store conformance: input admission, idempotency, input policies, the queue and stop requests."""

from __future__ import annotations

import pytest

from runtime.domain import (
    MAX_TEXT_CHARS,
    InputPolicy,
    MessageRole,
    QueuedItemStatus,
    RunStatus,
    RunTrigger,
)
from runtime.errors import Conflict, InvalidInput, NotFound, RunActive, TooLarge
from runtime.storage.store import RunChange, StepCommit, Store
from tests.conformance.store_helpers import (
    SCOPES,
    assistant,
    finish,
    new_thread,
    start_run,
    suspend,
    text,
)


async def version_of(store: Store, thread_id: str) -> int:
    return (await store.get_thread(thread_id, SCOPES)).version


# --- submit_input -------------------------------------------------------------------------


async def test_submit_on_idle_thread_appends_message_and_creates_run(store: Store) -> None:
    thread = await new_thread(store)
    tools = [{"name": "pick_color", "parameters": {"type": "object"}}]
    admission = await store.submit_input(
        thread.id,
        SCOPES,
        text="hi",
        submitted_by="alice",
        client_request_id="r1",
        client_tools=tools,
    )
    assert admission.version == 2 and not admission.duplicate
    assert admission.run_id and admission.message_id and admission.queued_item_id is None
    [message] = await store.list_messages(thread.id)
    assert (message.id, message.role, message.position) == (
        admission.message_id,
        MessageRole.USER,
        0,
    )
    assert message.client_request_id == "r1" and message.text() == "hi"
    run = await store.get_run(admission.run_id)
    assert (run.status, run.trigger, run.started_by) == (
        RunStatus.QUEUED,
        RunTrigger.MESSAGE,
        "alice",
    )
    assert run.input_message_id == message.id and run.client_tools == tuple(tools)
    assert run.scope == thread.scope and run.episode == 0 and not run.stop_requested
    assert await store.active_run(thread.id) == run


@pytest.mark.parametrize(
    ("value", "error"),
    [("", InvalidInput), ("   \n", InvalidInput), ("x" * (MAX_TEXT_CHARS + 1), TooLarge)],
)
async def test_submit_rejects_bad_text_and_changes_nothing(
    store: Store, value: str, error: type[Exception]
) -> None:
    thread = await new_thread(store)
    with pytest.raises(error):
        await store.submit_input(thread.id, SCOPES, text=value, submitted_by="alice")
    assert await version_of(store, thread.id) == 1
    assert await store.list_messages(thread.id) == []
    assert await store.active_run(thread.id) is None


async def test_submit_rejects_bad_policy_and_client_tools(store: Store) -> None:
    thread = await new_thread(store)
    with pytest.raises(InvalidInput):
        await store.submit_input(
            thread.id,
            SCOPES,
            text="x",
            submitted_by="a",
            policy="shout",  # type: ignore[arg-type]
        )
    with pytest.raises(InvalidInput):
        await store.submit_input(
            thread.id,
            SCOPES,
            text="x",
            submitted_by="a",
            client_tools=["nope"],  # type: ignore[list-item]
        )
    assert await version_of(store, thread.id) == 1


async def test_duplicate_request_names_original_message_and_run(store: Store) -> None:
    thread = await new_thread(store)
    first = await store.submit_input(
        thread.id, SCOPES, text="hi", submitted_by="alice", client_request_id="r1"
    )
    again = await store.submit_input(
        thread.id, SCOPES, text="hi again", submitted_by="alice", client_request_id="r1"
    )
    assert again.duplicate
    assert (again.message_id, again.run_id, again.version) == (
        first.message_id,
        first.run_id,
        first.version,
    )
    assert len(await store.list_messages(thread.id)) == 1
    # The same id on another thread is a different request.
    other = await new_thread(store)
    fresh = await store.submit_input(
        other.id, SCOPES, text="hi", submitted_by="alice", client_request_id="r1"
    )
    assert not fresh.duplicate


async def test_duplicate_queued_request_names_original_item(store: Store) -> None:
    thread = await new_thread(store)
    _, lease = await start_run(store, thread.id)
    queued = await store.submit_input(
        thread.id, SCOPES, text="later", submitted_by="bob", client_request_id="r2"
    )
    again = await store.submit_input(
        thread.id, SCOPES, text="later", submitted_by="bob", client_request_id="r2"
    )
    assert again.duplicate and again.queued_item_id == queued.queued_item_id
    assert again.version == queued.version
    assert len(await store.list_queue(thread.id)) == 1
    # Once admitted, the duplicate also names the message and run it became.
    await finish(store, lease)
    admitted = await store.submit_input(
        thread.id, SCOPES, text="later", submitted_by="bob", client_request_id="r2"
    )
    assert admitted.duplicate and admitted.queued_item_id == queued.queued_item_id
    active = await store.active_run(thread.id)
    assert active is not None and admitted.run_id == active.id
    assert admitted.message_id == active.input_message_id


async def test_enqueue_while_run_is_active(store: Store) -> None:
    thread = await new_thread(store)
    first = await store.submit_input(thread.id, SCOPES, text="one", submitted_by="alice")
    two = await store.submit_input(thread.id, SCOPES, text="two", submitted_by="bob")
    three = await store.submit_input(
        thread.id, SCOPES, text="three", submitted_by="carol", policy=InputPolicy.ENQUEUE
    )
    assert (two.version, three.version) == (first.version + 1, first.version + 2)
    assert two.queued_item_id and two.run_id is None and two.message_id is None
    queue = await store.list_queue(thread.id)
    assert [(q.id, q.text, q.position) for q in queue] == [
        (two.queued_item_id, "two", 0),
        (three.queued_item_id, "three", 1),
    ]
    assert all(q.status is QueuedItemStatus.QUEUED and not q.interrupt for q in queue)
    # Input during a run is queued, never appended.
    assert len(await store.list_messages(thread.id)) == 1


async def test_reject_policy_raises_run_active_and_changes_nothing(store: Store) -> None:
    thread = await new_thread(store)
    first = await store.submit_input(thread.id, SCOPES, text="one", submitted_by="alice")
    with pytest.raises(RunActive) as caught:
        await store.submit_input(
            thread.id, SCOPES, text="two", submitted_by="bob", policy=InputPolicy.REJECT
        )
    assert caught.value.code == "run_active"
    assert await version_of(store, thread.id) == first.version
    assert await store.list_queue(thread.id) == []


async def test_interrupt_policy_queues_and_requests_stop(store: Store) -> None:
    thread = await new_thread(store)
    admission, _ = await start_run(store, thread.id)
    interrupt = await store.submit_input(
        thread.id, SCOPES, text="stop, do this", submitted_by="bob", policy=InputPolicy.INTERRUPT
    )
    assert interrupt.interrupted_run_id == admission.run_id and interrupt.queued_item_id
    [item] = await store.list_queue(thread.id)
    assert item.interrupt and item.id == interrupt.queued_item_id
    run = await store.get_run(admission.run_id or "")
    assert run.stop_requested and run.status is RunStatus.RUNNING
    snapshot = await store.snapshot(thread.id, SCOPES)
    assert snapshot.queue[0].interrupt


# --- queue admission on run end -----------------------------------------------------------


@pytest.mark.parametrize("end", [RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED])
async def test_terminal_commit_admits_exactly_one_queued_item(store: Store, end: RunStatus) -> None:
    thread = await new_thread(store)
    admission, lease = await start_run(store, thread.id)
    await store.commit(lease, StepCommit(append=(assistant(text("answer")),)))
    tools = [{"name": "t"}]
    two = await store.submit_input(
        thread.id,
        SCOPES,
        text="two",
        submitted_by="bob",
        client_request_id="c2",
        client_tools=tools,
    )
    three = await store.submit_input(thread.id, SCOPES, text="three", submitted_by="carol")
    before = await version_of(store, thread.id)
    version = await finish(store, lease, end)
    assert version.version == before + 1  # run end + admission: one transaction, one bump
    assert version.admitted  # workers are woken for the admitted run
    assert (await store.get_run(admission.run_id or "")).status is end
    active = await store.active_run(thread.id)
    assert active is not None and active.id != admission.run_id
    assert (active.status, active.trigger, active.started_by) == (
        RunStatus.QUEUED,
        RunTrigger.QUEUED,
        "bob",
    )
    assert active.client_tools == tuple(tools)
    messages = await store.list_messages(thread.id)
    assert [m.text() for m in messages] == ["hello", "answer", "two"]
    assert messages[-1].id == active.input_message_id and messages[-1].client_request_id == "c2"
    assert [q.id for q in await store.list_queue(thread.id)] == [three.queued_item_id]
    snapshot = await store.snapshot(thread.id, SCOPES)
    assert snapshot.run is not None and snapshot.run.id == active.id
    assert [q.id for q in snapshot.queue] == [three.queued_item_id]
    assert two.queued_item_id not in {q.id for q in snapshot.queue}


async def test_terminal_commit_without_admit_next_leaves_queue(store: Store) -> None:
    thread = await new_thread(store)
    _, lease = await start_run(store, thread.id)
    await store.submit_input(thread.id, SCOPES, text="two", submitted_by="bob")
    version = await store.commit(
        lease, StepCommit(run=RunChange(status=RunStatus.COMPLETED), admit_next=False)
    )
    assert not version.admitted
    assert await store.active_run(thread.id) is None
    assert len(await store.list_queue(thread.id)) == 1


async def test_terminal_commit_with_empty_queue_leaves_thread_idle(store: Store) -> None:
    thread = await new_thread(store)
    admission, lease = await start_run(store, thread.id)
    assert not (await finish(store, lease)).admitted  # nothing to wake workers for
    assert await store.active_run(thread.id) is None
    snapshot = await store.snapshot(thread.id, SCOPES)
    assert snapshot.run is not None and snapshot.run.id == admission.run_id
    assert snapshot.run.status is RunStatus.COMPLETED
    # The next input starts a new run directly.
    nxt = await store.submit_input(thread.id, SCOPES, text="again", submitted_by="alice")
    assert nxt.run_id is not None and nxt.run_id != admission.run_id


# --- cancel_queued_item -------------------------------------------------------------------


async def test_cancel_queued_item(store: Store) -> None:
    thread = await new_thread(store)
    _, lease = await start_run(store, thread.id)
    two = await store.submit_input(thread.id, SCOPES, text="two", submitted_by="bob")
    three = await store.submit_input(thread.id, SCOPES, text="three", submitted_by="bob")
    version = await store.cancel_queued_item(thread.id, SCOPES, two.queued_item_id or "")
    assert version == three.version + 1
    assert [q.id for q in await store.list_queue(thread.id)] == [three.queued_item_id]
    with pytest.raises(Conflict):
        await store.cancel_queued_item(thread.id, SCOPES, two.queued_item_id or "")
    with pytest.raises(NotFound):
        await store.cancel_queued_item(thread.id, SCOPES, "qi_unknown")
    assert await version_of(store, thread.id) == version
    # Cancelled items are skipped at admission; admitted items cannot be cancelled.
    await finish(store, lease)
    assert [m.text() for m in await store.list_messages(thread.id)][-1] == "three"
    with pytest.raises(Conflict):
        await store.cancel_queued_item(thread.id, SCOPES, three.queued_item_id or "")


async def test_cancel_item_of_another_thread_is_not_found(store: Store) -> None:
    thread = await new_thread(store)
    other = await new_thread(store)
    await start_run(store, thread.id)
    item = await store.submit_input(thread.id, SCOPES, text="two", submitted_by="bob")
    with pytest.raises(NotFound):
        await store.cancel_queued_item(other.id, SCOPES, item.queued_item_id or "")


# --- request_stop -------------------------------------------------------------------------


async def test_stop_queued_run_cancels_it_and_admits_next(store: Store) -> None:
    thread = await new_thread(store)
    first = await store.submit_input(thread.id, SCOPES, text="one", submitted_by="alice")
    queued = await store.submit_input(thread.id, SCOPES, text="two", submitted_by="bob")
    result = await store.request_stop(thread.id, SCOPES, first.run_id or "")
    assert result.status is RunStatus.CANCELLED and result.version == queued.version + 1
    assert (await store.get_run(first.run_id or "")).status is RunStatus.CANCELLED
    active = await store.active_run(thread.id)
    assert active is not None and active.started_by == "bob"
    assert await store.list_queue(thread.id) == []


async def test_stop_running_run_sets_flag_without_bump(store: Store) -> None:
    thread = await new_thread(store)
    admission, _ = await start_run(store, thread.id)
    before = await store.snapshot(thread.id, SCOPES)
    result = await store.request_stop(thread.id, SCOPES, admission.run_id or "")
    assert result.status is RunStatus.RUNNING and result.version == before.thread.version
    assert (await store.get_run(admission.run_id or "")).stop_requested
    assert await store.snapshot(thread.id, SCOPES) == before
    again = await store.request_stop(thread.id, SCOPES, admission.run_id or "")
    assert again.version == before.thread.version


async def test_stop_waiting_run_makes_it_runnable(store: Store) -> None:
    thread = await new_thread(store)
    admission, lease = await start_run(store, thread.id)
    await suspend(store, lease)
    await store.release_lease(lease)
    assert await store.find_runnable_runs() == []
    result = await store.request_stop(thread.id, SCOPES, admission.run_id or "")
    assert result.status is RunStatus.WAITING
    assert [r.id for r in await store.find_runnable_runs()] == [admission.run_id]


async def test_stop_terminal_run_changes_nothing(store: Store) -> None:
    thread = await new_thread(store)
    admission, lease = await start_run(store, thread.id)
    version = await finish(store, lease)
    result = await store.request_stop(thread.id, SCOPES, admission.run_id or "")
    assert (result.status, result.version) == (RunStatus.COMPLETED, version.version)
    assert not (await store.get_run(admission.run_id or "")).stop_requested


async def test_stop_run_of_another_thread_is_not_found(store: Store) -> None:
    thread = await new_thread(store)
    other = await new_thread(store)
    admission = await store.submit_input(thread.id, SCOPES, text="x", submitted_by="a")
    with pytest.raises(NotFound):
        await store.request_stop(other.id, SCOPES, admission.run_id or "")
    with pytest.raises(NotFound):
        await store.request_stop(thread.id, SCOPES, "run_unknown")
    assert (await store.get_run(admission.run_id or "")).status is RunStatus.QUEUED
