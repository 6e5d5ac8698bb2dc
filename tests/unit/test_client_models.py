"""The Python client reads the server's snapshot, parts and chunks as the server's own models."""

from __future__ import annotations

from typing import Any

import orjson

from runtime import domain
from runtime.approvals import ApprovalDecision, ApprovalPolicy, ApprovalState
from server.live.inbox import entry_actions, inbox_frames
from server.live.presence import aggregate, presence_frames
from server.protocol import answers
from threadline_client import (
    Message,
    OtherPart,
    PendingAction,
    Principal,
    QueuedItemView,
    Role,
    RunStatus,
    Snapshot,
    TextDeltaChunk,
    TextPart,
    ThreadlineClient,
    ThreadPage,
    ThreadWatch,
    ToolCallPart,
    ToolState,
    WaitKind,
)
from threadline_client.models import ACTIVE_RUN_STATUSES, typed_chunk
from threadline_wire import chunks, message_parts
from threadline_wire.approval_progress import ApprovalProgress
from threadline_wire.frames import ChunkEnvelope, ErrorFrame, InvalidateEnvelope, Subscribed
from threadline_wire.live_frames import (
    ActionPendingFrame,
    ActionResolvedFrame,
    ActionsResyncFrame,
    ChunkFrame,
    InvalidateFrame,
    OtherFrame,
    parse_frame,
)
from threadline_wire.presence_frames import (
    PresenceJoined,
    PresenceLeft,
    PresenceMember,
    PresenceSet,
    PresenceUpdated,
)


def _server_snapshot() -> domain.Snapshot:
    waiting = domain.Waiting(
        action_id="act-1",
        kind=domain.WaitKind.APPROVAL,
        payload_schema={"type": "object"},
        allowed_roles=(domain.Role.USER,),
    )
    tool = domain.ToolCallPart(
        tool_call_id="call-1",
        name="send_email",
        input={"to": "a@example.com"},
        state=domain.ToolState.AWAITING_ACTION,
        waiting=waiting,
    )
    message = domain.MessageView(
        id="m1",
        role=domain.MessageRole.ASSISTANT,
        visibility=domain.Visibility.VISIBLE,
        parts=(domain.TextPart(text="hello "), tool),
        run_id="r1",
    )
    return domain.Snapshot(
        thread=domain.ThreadView(id="t1", scope="s", title="", version=3, metadata={}),
        messages=(message,),
        pending_actions=tuple(
            domain.pending_actions_of(
                domain.Message(
                    id="m1",
                    thread_id="t1",
                    position=0,
                    role=domain.MessageRole.ASSISTANT,
                    parts=message.parts,
                    run_id="r1",
                    created_at=0.0,
                    updated_at=0.0,
                )
            )
        ),
        run=domain.RunView(id="r1", status=domain.RunStatus.WAITING),
        queue=(domain.QueuedItemView(id="q1", text="next", submitted_by="alice"),),
    )


def test_a_snapshot_the_server_writes_reads_back_typed() -> None:
    server = _server_snapshot()
    client = Snapshot.model_validate(server.to_wire())
    message = client.messages[0]
    text, tool = message.parts
    assert isinstance(text, TextPart) and text.text == "hello "
    assert isinstance(tool, ToolCallPart) and tool.state is ToolState.AWAITING_ACTION
    assert tool.waiting is not None and tool.waiting.kind is WaitKind.APPROVAL
    assert message.text == "hello "
    assert client.run is not None and client.run.status is RunStatus.WAITING
    assert client.run.status in ACTIVE_RUN_STATUSES
    assert client.queue == [QueuedItemView(id="q1", text="next", submitted_by="alice")]
    assert client.pending_actions[0].kind is WaitKind.APPROVAL
    assert client.pending_actions[0].thread_id == "t1"


def test_the_server_parts_are_the_wire_models() -> None:
    # One definition: the server's strict parts extend the wire's, the enums are the same.
    assert issubclass(domain.TextPart, message_parts.TextPart)
    assert issubclass(domain.ToolCallPart, message_parts.ToolCallPart)
    assert issubclass(domain.QueuedItemView, message_parts.QueuedItemView)
    assert issubclass(domain.RunView, message_parts.RunView)
    assert issubclass(domain.PendingAction, message_parts.PendingAction)
    assert domain.RunStatus is RunStatus and domain.ToolState is ToolState
    part = domain.TextPart(text="x")
    assert TextPart.model_validate(part.model_dump()) == TextPart(text="x")


def test_an_unknown_part_or_chunk_from_a_newer_server_is_kept() -> None:
    raw: dict[str, Any] = {"id": "m", "role": "assistant", "parts": [{"type": "image", "u": 1}]}
    (part,) = Message.model_validate(raw).parts
    assert isinstance(part, OtherPart) and part.type == "image"
    assert part.model_extra == {"u": 1}
    assert typed_chunk({"type": "audio-delta", "b": "x"}) == {"type": "audio-delta", "b": "x"}


def test_a_chunk_reads_as_the_runtime_s_own_model() -> None:
    chunk = typed_chunk({"type": "text-delta", "delta": "hi"})
    assert isinstance(chunk, TextDeltaChunk) and chunk.delta == "hi"
    assert chunks.TextDeltaChunk is TextDeltaChunk


def test_the_server_answers_are_the_wire_answers_the_client_reads() -> None:
    thread = domain.Thread(
        id="t1",
        scope="s",
        title="x",
        version=2,
        metadata={"k": "v"},
        private_metadata={"secret": 1},
        created_at=1.0,
        updated_at=2.0,
    )
    body = answers.threads_answer([thread], limit=1)
    assert set(body["threads"][0]) == {
        "id", "scope", "title", "version", "metadata", "owner", "created_at", "updated_at"
    }  # fmt: skip
    page = ThreadPage.model_validate(body)
    assert page.threads[0].metadata == {"k": "v"} and page.next_cursor is not None
    principal = domain.Principal(subject="ann", role=domain.Role.USER, scopes=frozenset({"s"}))
    me = Principal.model_validate(answers.principal_answer(principal))
    assert me.role is Role.USER and me.name == "ann"
    assert answers.metadata_answer(thread) == {
        "thread_id": "t1",
        "version": 2,
        "metadata": {"k": "v"},
    }


# --- live frames: presence, the inbox, replies (issue 33) -----------------------------------


def _decided_action() -> domain.PendingAction:
    """A pending approval under a two-approval policy, one approval in, as the server holds it."""
    policy = ApprovalPolicy(quorum=2, subjects=("alice", "bob"), deadline=60.0)
    decision = ApprovalDecision(subject="bob", display_name="Bob", approved=True, payload={}, at=2)
    state = ApprovalState(
        policy=policy, requester="carol", decisions=(decision,), due_at=99.0, waiting_for="alice"
    )
    return domain.PendingAction(
        id="act-1",
        kind=domain.WaitKind.APPROVAL,
        run_id="r1",
        message_id="m1",
        tool_call_id="call-1",
        tool_name="send_email",
        input={"to": "a@example.com"},
        payload_schema={"type": "object"},
        allowed_roles=(domain.Role.USER,),
        approval=state,
    )


def test_inbox_frames_the_server_builds_read_typed_with_the_approval_progress() -> None:
    entry = domain.InboxEntry(
        thread_id="t1", scope="acme", thread_version=4, created_at=1.0, actions=(_decided_action(),)
    )
    after = entry_actions(entry)
    pending, resolved = [
        parse_frame(orjson.loads(orjson.dumps(f)))
        for f in inbox_frames("acme", "t1", 4, {"gone": {"id": "gone"}}, after)
    ]
    assert isinstance(pending, ActionPendingFrame) and pending.version == 4
    action = pending.action
    assert isinstance(action, PendingAction) and action.kind is WaitKind.APPROVAL
    progress = action.approval
    assert isinstance(progress, ApprovalProgress)
    assert (progress.approvals, progress.needed, progress.waiting_for) == (1, 1, "alice")
    assert progress.policy.quorum == 2 and progress.policy.subjects == ("alice", "bob")
    assert progress.decisions[0].subject == "bob" and progress.decisions[0].approved
    assert progress.due_at == 99.0 and progress.assigned is None
    assert isinstance(resolved, ActionResolvedFrame) and resolved.action_id == "gone"
    resync = parse_frame({"type": "actions.resync", "scope": "acme"})
    assert isinstance(resync, ActionsResyncFrame) and resync.scope == "acme"


def test_presence_frames_the_server_builds_read_typed() -> None:
    def entry(subject: str, **fields: Any) -> dict[str, Any]:
        shown = {"subject": subject, "role": "user", "name": subject, "typing": False}
        return {**shown, "reviewing": None, "updated_at": 1.0, "expires_at": 9e9, **fields}

    before = aggregate({"a": entry("alice"), "b": entry("bob")})
    after = aggregate({"a": entry("alice", typing=True), "a2": entry("alice"), "c": entry("carol")})
    updated, joined, left = [parse_frame(f) for f in presence_frames("t1", before, after)]
    assert isinstance(updated, PresenceUpdated) and updated.member.connections == 2
    assert updated.member.typing is True and updated.member.role == "user"
    assert isinstance(joined, PresenceJoined) and joined.member.subject == "carol"
    assert isinstance(left, PresenceLeft) and left.subject == "bob"
    whole = parse_frame({"type": "presence", "thread_id": "t1", "members": list(after.values())})
    assert isinstance(whole, PresenceSet)
    assert [m.subject for m in whole.members] == ["alice", "carol"]


def test_the_server_s_replies_and_live_envelopes_read_as_their_models() -> None:
    subscribed = parse_frame(orjson.loads(Subscribed(thread_id="t1", version=3, id=7).to_bytes()))
    assert isinstance(subscribed, Subscribed) and subscribed.version == 3
    error = parse_frame(orjson.loads(ErrorFrame(code="not_found", message="no").to_bytes()))
    assert isinstance(error, ErrorFrame) and error.code == "not_found"
    envelope = ChunkEnvelope(thread_id="t1", run_id="r1", seq=5, chunk={"type": "text-delta"})
    chunk = parse_frame(envelope.model_dump(mode="json"))
    assert isinstance(chunk, ChunkFrame) and chunk.seq == 5 and chunk.run_id == "r1"
    invalidate = parse_frame(InvalidateEnvelope(thread_id="t1", version=9).model_dump())
    assert isinstance(invalidate, InvalidateFrame) and invalidate.version == 9


def test_unknown_frames_and_fields_from_a_newer_server_are_kept_not_fatal() -> None:
    newer = parse_frame({"type": "presence.cursor", "thread_id": "t1", "at": 4})
    assert isinstance(newer, OtherFrame) and newer.type == "presence.cursor"
    assert newer.model_extra == {"thread_id": "t1", "at": 4}
    # A known type this client cannot read (a field changed shape) falls back too.
    odd = parse_frame({"type": "presence.leave", "thread_id": "t1", "subject": {"id": 1}})
    assert isinstance(odd, OtherFrame) and odd.type == "presence.leave"
    assert isinstance(parse_frame({"no": "type"}), OtherFrame)
    # New fields inside known frames are kept.
    wire = _decided_action().model_dump(mode="json", by_alias=True)
    wire["approval"] = {**wire["approval"], "quorum_kind": "weighted"}
    wire["approval"]["policy"] = {**wire["approval"]["policy"], "on_expiry": "escalate"}
    action = PendingAction.model_validate(wire)
    assert action.approval is not None and action.approval.policy.on_expiry == "escalate"
    assert action.approval.model_extra == {"quorum_kind": "weighted"}
    member = PresenceMember.model_validate({"subject": "a", "cursor": 3})
    assert member.model_extra == {"cursor": 3}


def test_a_watch_holds_typed_presence_and_typed_event_frames() -> None:
    watch = ThreadWatch(ThreadlineClient("http://127.0.0.1:9", token="t"), "t1")
    alice = {"subject": "alice", "role": "user", "name": "Alice", "connections": 2}
    watch._on_frame({"type": "presence", "thread_id": "t1", "members": [alice]})
    assert list(watch.presence) == ["alice"] and watch.presence["alice"].connections == 2
    # A member it cannot read is skipped (the event's frame: an OtherFrame), never a crash.
    watch._on_frame({"type": "presence.join", "thread_id": "t1", "member": {"name": "x"}})
    assert list(watch.presence) == ["alice"]
    watch._on_frame({"type": "presence.leave", "thread_id": "t1", "subject": "alice"})
    assert watch.presence == {}
    watch._on_frame({"type": "error", "thread_id": "t1", "code": "rate_limited", "message": "m"})
    frames = [event.frame for event in watch._events]
    assert [type(f) for f in frames] == [PresenceSet, OtherFrame, PresenceLeft, ErrorFrame]
