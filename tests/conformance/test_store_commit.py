"""Store conformance: the fenced step commit, run transitions and the tail-message invariant."""

from __future__ import annotations

import pytest

from runtime.domain import (
    MAX_TEXT_CHARS,
    MessageRole,
    NewMessage,
    RunStatus,
    TextPart,
    ToolCallPart,
    ToolState,
)
from runtime.errors import (
    Conflict,
    IllegalTransition,
    InvalidInput,
    InvariantViolation,
    LeaseLost,
    TooLarge,
)
from runtime.storage.store import RunChange, StepCommit, Store, TailUpdate
from tests.conformance.ill_typed import ill_typed
from tests.conformance.store_helpers import (
    SCOPES,
    assistant,
    finish,
    new_thread,
    pending_part,
    resolution,
    start_run,
    suspend,
    text,
)


async def version_of(store: Store, thread_id: str) -> int:
    return (await store.get_thread(thread_id, SCOPES)).version


async def test_commit_appends_updates_tail_and_bumps_once(store: Store) -> None:
    thread = await new_thread(store)
    admission, lease = await start_run(store, thread.id)
    before = await version_of(store, thread.id)
    version = await store.commit(
        lease,
        StepCommit(append=(assistant(text("a")), assistant(text("b"))), next_seq=5),
    )
    assert version.version == before + 1
    messages = await store.list_messages(thread.id)
    assert [(m.position, m.text(), m.run_id) for m in messages[1:]] == [
        (1, "a", admission.run_id),
        (2, "b", admission.run_id),
    ]
    assert (await store.get_run(admission.run_id or "")).next_seq == 5
    tail = messages[-1]
    version = await store.commit(
        lease, StepCommit(update_tail=TailUpdate(message_id=tail.id, parts=(text("b!"),)))
    )
    assert version.version == before + 2
    assert (await store.list_messages(thread.id))[-1].text() == "b!"
    snapshot = await store.snapshot(thread.id, SCOPES)
    assert snapshot.thread.version == version.version and snapshot.run is not None
    assert snapshot.run.next_seq == 5


async def test_commit_keeps_given_message_id_and_rejects_reuse(store: Store) -> None:
    thread = await new_thread(store)
    _, lease = await start_run(store, thread.id)
    message = NewMessage(role=MessageRole.ASSISTANT, parts=(text("x"),), id="msg_fixed")
    await store.commit(lease, StepCommit(append=(message,)))
    assert (await store.list_messages(thread.id))[-1].id == "msg_fixed"
    before = await version_of(store, thread.id)
    messages = await store.list_messages(thread.id)
    with pytest.raises(Conflict):
        await store.commit(lease, StepCommit(append=(message,)))
    assert await version_of(store, thread.id) == before
    # Nothing of the refused commit stays (not its next_seq either), and the run goes on.
    assert await store.list_messages(thread.id) == messages
    with pytest.raises(Conflict):  # the id is taken in another thread too
        other = await new_thread(store)
        _, other_lease = await start_run(store, other.id)
        await store.commit(other_lease, StepCommit(append=(message,), next_seq=9))
    assert (await store.get_run(other_lease.resource_id)).next_seq != 9
    after = await store.commit(lease, StepCommit(append=(assistant(text("y")),)))
    assert after.version == before + 1


async def test_empty_commit_changes_nothing(store: Store) -> None:
    thread = await new_thread(store)
    _, lease = await start_run(store, thread.id)
    before = await version_of(store, thread.id)
    assert (await store.commit(lease, StepCommit())).version == before
    assert await version_of(store, thread.id) == before


async def test_run_transitions_are_guarded(store: Store) -> None:
    thread = await new_thread(store)
    admission, lease = await start_run(store, thread.id)
    before = await store.snapshot(thread.id, SCOPES)
    with pytest.raises(IllegalTransition):
        await store.commit(
            lease,
            StepCommit(
                append=(assistant(text("lost with the error")),),
                run=RunChange(status=RunStatus.QUEUED),
            ),
        )
    assert await store.snapshot(thread.id, SCOPES) == before
    version = await store.commit(
        lease, StepCommit(run=RunChange(status=RunStatus.FAILED, error="model down"))
    )
    run = await store.get_run(admission.run_id or "")
    assert (run.status, run.error) == (RunStatus.FAILED, "model down")
    snapshot = await store.snapshot(thread.id, SCOPES)
    assert snapshot.run is not None and snapshot.run.error == "model down"
    assert snapshot.thread.version == version.version
    # A finished run takes no more writes: its terminal commit released the lease with it.
    with pytest.raises(LeaseLost):
        await store.commit(lease, StepCommit(append=(assistant(text("late")),)))
    with pytest.raises(LeaseLost):
        await store.commit(lease, StepCommit(run=RunChange(status=RunStatus.COMPLETED)))


async def test_terminal_transition_clears_stop_request(store: Store) -> None:
    thread = await new_thread(store)
    admission, lease = await start_run(store, thread.id)
    await store.request_stop(thread.id, SCOPES, admission.run_id or "")
    await finish(store, lease, RunStatus.CANCELLED)
    run = await store.get_run(admission.run_id or "")
    assert run.status is RunStatus.CANCELLED and not run.stop_requested


async def test_next_seq_never_goes_back(store: Store) -> None:
    thread = await new_thread(store)
    admission, lease = await start_run(store, thread.id)
    await store.commit(lease, StepCommit(next_seq=10))
    with pytest.raises(InvariantViolation):
        await store.commit(lease, StepCommit(next_seq=3))
    assert (await store.get_run(admission.run_id or "")).next_seq == 10


# --- tail-message invariant ---------------------------------------------------------------


async def test_only_the_tail_can_be_updated(store: Store) -> None:
    thread = await new_thread(store)
    _, lease = await start_run(store, thread.id)
    await store.commit(lease, StepCommit(append=(assistant(text("a")), assistant(text("b")))))
    messages = await store.list_messages(thread.id)
    before = await store.snapshot(thread.id, SCOPES)
    for message_id in (messages[0].id, messages[1].id, "msg_unknown"):
        with pytest.raises(InvariantViolation):
            await store.commit(
                lease,
                StepCommit(update_tail=TailUpdate(message_id=message_id, parts=(text("x"),))),
            )
    assert await store.snapshot(thread.id, SCOPES) == before


async def test_nothing_is_appended_after_a_pending_tail(store: Store) -> None:
    thread = await new_thread(store)
    _, lease = await start_run(store, thread.id)
    await store.commit(lease, StepCommit(append=(assistant(pending_part("act-1")),)))
    before = await store.snapshot(thread.id, SCOPES)
    with pytest.raises(InvariantViolation):
        await store.commit(lease, StepCommit(append=(assistant(text("after")),)))
    # Not even within one commit.
    other = await new_thread(store)
    _, lease2 = await start_run(store, other.id)
    with pytest.raises(InvariantViolation):
        await store.commit(
            lease2,
            StepCommit(append=(assistant(pending_part("act-2")), assistant(text("after")))),
        )
    assert await store.snapshot(thread.id, SCOPES) == before
    assert len(await store.list_messages(other.id)) == 1


async def test_a_run_only_waits_with_a_pending_action(store: Store) -> None:
    thread = await new_thread(store)
    _, lease = await start_run(store, thread.id)
    with pytest.raises(InvariantViolation):
        await store.commit(lease, StepCommit(run=RunChange(status=RunStatus.WAITING)))
    await suspend(store, lease, "act-1")
    snapshot = await store.snapshot(thread.id, SCOPES)
    assert snapshot.run is not None and snapshot.run.status is RunStatus.WAITING


async def test_wait_after_a_racing_resolution_leaves_the_run_running(store: Store) -> None:
    thread = await new_thread(store)
    admission, lease = await start_run(store, thread.id)
    await store.commit(lease, StepCommit(append=(assistant(pending_part("act-1")),)))
    # The resolution lands between the commit that suspended and the transition to waiting.
    await store.resolve_action(thread.id, SCOPES, "act-1", resolution())
    await store.commit(lease, StepCommit(run=RunChange(status=RunStatus.WAITING)))
    run = await store.get_run(admission.run_id or "")
    assert run.status is RunStatus.RUNNING  # still runnable: the resolution is not lost
    await store.release_lease(lease)
    assert [r.id for r in await store.find_runnable_runs()] == [admission.run_id]


async def test_tail_tool_parts_only_move_forward(store: Store) -> None:
    thread = await new_thread(store)
    _, lease = await start_run(store, thread.id)
    part = pending_part("act-1")
    await store.commit(lease, StepCommit(append=(assistant(part),)))
    tail = (await store.list_messages(thread.id))[-1]
    done = part.transition(ToolState.RUNNING).transition(ToolState.OUTPUT_AVAILABLE, output=1)
    await store.commit(lease, StepCommit(update_tail=TailUpdate(message_id=tail.id, parts=(done,))))
    with pytest.raises(IllegalTransition):
        await store.commit(
            lease, StepCommit(update_tail=TailUpdate(message_id=tail.id, parts=(part,)))
        )


async def test_stale_tail_update_cannot_undo_a_resolution(store: Store) -> None:
    thread = await new_thread(store)
    _, lease = await start_run(store, thread.id)
    part = pending_part("act-1")
    await store.commit(lease, StepCommit(append=(assistant(text("x"), part),)))
    tail = (await store.list_messages(thread.id))[-1]
    await store.resolve_action(thread.id, SCOPES, "act-1", resolution())
    with pytest.raises(InvariantViolation):
        await store.commit(
            lease, StepCommit(update_tail=TailUpdate(message_id=tail.id, parts=(text("y"), part)))
        )
    assert (await store.snapshot(thread.id, SCOPES)).pending_actions == ()


async def test_terminal_commit_cancels_actions_left_awaiting(store: Store) -> None:
    thread = await new_thread(store)
    admission, lease = await start_run(store, thread.id)
    await suspend(store, lease, "act-1")
    await store.request_stop(thread.id, SCOPES, admission.run_id or "")
    await finish(store, lease, RunStatus.CANCELLED)
    snapshot = await store.snapshot(thread.id, SCOPES)
    assert snapshot.pending_actions == ()
    last = snapshot.messages[-1].parts[-1]
    assert isinstance(last, ToolCallPart) and last.state is ToolState.CANCELLED
    # And the thread takes input again.
    admission = await store.submit_input(thread.id, SCOPES, text="next", submitted_by="alice")
    assert admission.run_id is not None


# --- bad input ----------------------------------------------------------------------------


async def test_malformed_and_oversized_parts_are_refused(store: Store) -> None:
    thread = await new_thread(store)
    _, lease = await start_run(store, thread.id)
    tail = (await store.list_messages(thread.id))[-1]
    before = await store.snapshot(thread.id, SCOPES)
    bogus = NewMessage.model_construct(
        role=MessageRole.ASSISTANT,
        parts=(ill_typed({"type": "bogus"}),),
        run_id=None,
        client_request_id=None,
        id=None,
    )
    huge = NewMessage.model_construct(
        role=MessageRole.ASSISTANT,
        parts=(TextPart.model_construct(type="text", text="x" * (MAX_TEXT_CHARS + 1)),),
        run_id=None,
        client_request_id=None,
        id=None,
    )
    bad_tail = TailUpdate.model_construct(
        message_id=tail.id, parts=(ill_typed({"type": "tool-call"}),)
    )
    with pytest.raises(InvalidInput):
        await store.commit(
            lease,
            StepCommit.model_construct(
                update_tail=None, append=(bogus,), run=None, next_seq=None, admit_next=True
            ),
        )
    with pytest.raises(TooLarge):
        await store.commit(
            lease,
            StepCommit.model_construct(
                update_tail=None, append=(huge,), run=None, next_seq=None, admit_next=True
            ),
        )
    with pytest.raises(InvalidInput):
        await store.commit(
            lease,
            StepCommit.model_construct(
                update_tail=bad_tail, append=(), run=None, next_seq=None, admit_next=True
            ),
        )
    assert await store.snapshot(thread.id, SCOPES) == before


async def test_append_for_another_run_is_refused(store: Store) -> None:
    thread = await new_thread(store)
    _, lease = await start_run(store, thread.id)
    message = NewMessage(role=MessageRole.ASSISTANT, parts=(text("x"),), run_id="run_other")
    with pytest.raises(InvariantViolation):
        await store.commit(lease, StepCommit(append=(message,)))
    assert len(await store.list_messages(thread.id)) == 1


# Text a write carries as an SQL literal where the backend sends held writes with COMMIT
# (Postgres): quotes, backslashes, placeholders, comment and statement syntax, non-ASCII.
AWKWARD = [
    "it's",
    "''; DROP TABLE messages; --",
    "back\\slash \\' \\\\",
    "$1 $2 $10 $$ E'\\n'",
    "tab\there\nnewline\r\n",
    "émoji 🎉 中文 \u2028",
    "/* open comment",
]


@pytest.mark.parametrize("value", AWKWARD)
async def test_written_text_reads_back_exactly(store: Store, value: str) -> None:
    thread = await new_thread(store)
    admission, lease = await start_run(store, thread.id, text=value)
    before = await version_of(store, thread.id)
    version = await store.commit(lease, StepCommit(append=(assistant(text(value)),)))
    assert version.version == before + 1
    version = await finish(store, lease)
    assert version.version == before + 2 == await version_of(store, thread.id)
    messages = await store.list_messages(thread.id)
    assert [m.text() for m in messages] == [value, value]
    run = await store.get_run(admission.run_id or "")
    assert run.status is RunStatus.COMPLETED
    assert run.updated_at >= run.created_at
