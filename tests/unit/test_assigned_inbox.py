"""The inbox's `assigned=me`: what a caller may decide now, in lists, frames and snapshots."""

from __future__ import annotations

import inspect

import orjson

from runtime.approvals import ApprovalDecision, ApprovalPolicy, ApprovalState
from runtime.domain import InboxEntry, PendingAction, Principal, Role, WaitKind
from runtime.service.assigned import assigned_to, decide_map, inbox_page, wire_refusal
from server.live.inbox import inbox_frames
from server.transports.ws.session import assigned_frame
from threadline_client import SyncThreadlineClient, ThreadlineClient

POLICY = ApprovalPolicy(quorum=2, subjects=("alice", "bob", "carol"), exclude_requester=True)


def _who(subject: str, role: Role = Role.USER) -> Principal:
    return Principal(subject=subject, role=role, scopes=frozenset({"acme"}))


def _action(action_id: str, decided_by: tuple[str, ...] = ()) -> PendingAction:
    decisions = tuple(
        ApprovalDecision(subject=s, display_name=s.title(), approved=True, payload={}, at=1.0)
        for s in decided_by
    )
    return PendingAction(
        id=action_id,
        kind=WaitKind.APPROVAL,
        run_id="run",
        message_id="msg",
        tool_call_id=f"call-{action_id}",
        tool_name="send_email",
        input={},
        payload_schema={},
        allowed_roles=(Role.USER, Role.BACKEND),
        approval=ApprovalState(policy=POLICY, requester="alice", decisions=decisions),
    )


def _entry(thread_id: str, *actions: PendingAction) -> InboxEntry:
    return InboxEntry(
        thread_id=thread_id, scope="acme", thread_version=3, created_at=1.0, actions=actions
    )


def test_assigned_keeps_what_the_caller_may_decide_now() -> None:
    entries = [_entry("t1", _action("a1")), _entry("t2", _action("a2", decided_by=("bob",)))]
    # The requester (four-eyes) decides nothing; bob decided a2 already; carol may decide both.
    assert assigned_to(_who("alice"), entries) == []
    assert [a.id for e in assigned_to(_who("bob"), entries) for a in e.actions] == ["a1"]
    assert [a.id for e in assigned_to(_who("carol"), entries) for a in e.actions] == ["a1", "a2"]
    # Not a decider (not named by the policy), and a role the step does not allow.
    assert assigned_to(_who("dave"), entries) == []
    assert assigned_to(_who("carol", Role.ADMIN), entries) == []


def test_a_filtered_page_keeps_the_cursor_of_the_threads_read() -> None:
    entries = [_entry("t1", _action("a1")), _entry("t2", _action("a2"))]
    page = inbox_page(_who("alice"), entries, limit=2, assigned=True)
    assert page.entries == () and page.next_cursor == "t2"
    assert inbox_page(_who("alice"), entries, limit=3, assigned=True).next_cursor is None
    assert len(inbox_page(_who("alice"), entries, limit=2, assigned=False).entries) == 2


def test_decide_map_says_why_not() -> None:
    actions = [_action("a1"), _action("a2", decided_by=("bob",))]
    assert decide_map(_who("alice"), actions) == {
        "a1": {"allowed": False, "reason": "requester_excluded"},
        "a2": {"allowed": False, "reason": "requester_excluded"},
    }
    assert decide_map(_who("bob"), actions) == {
        "a1": {"allowed": True, "reason": None},
        "a2": {"allowed": False, "reason": "already_decided"},
    }
    assert decide_map(_who("dave"), actions)["a1"]["reason"] == "not_a_decider"
    assert decide_map(_who("bob", Role.ADMIN), actions)["a1"]["reason"] == "forbidden"


def test_wire_form_gives_the_same_answer() -> None:
    wire = _action("a2", decided_by=("bob",)).model_dump(mode="json", by_alias=True)
    assert "approvals" in wire["approval"]  # computed fields travel; they are not read back
    assert wire_refusal(_who("bob"), wire) == "already_decided"
    assert wire_refusal(_who("carol"), wire) is None


def _pending_frame(action: PendingAction) -> bytes:
    wire = action.model_dump(mode="json", by_alias=True)
    return orjson.dumps(
        {"type": "action.pending", "scope": "acme", "thread_id": "t1", "version": 4, "action": wire}
    )


def test_an_assigned_subscriber_sees_an_action_it_decided_leave() -> None:
    frame = _pending_frame(_action("a1", decided_by=("bob",)))
    assert assigned_frame(_who("carol"), frame) == frame
    assert orjson.loads(assigned_frame(_who("bob"), frame)) == {
        "type": "action.resolved",
        "scope": "acme",
        "thread_id": "t1",
        "version": 4,
        "action_id": "a1",
    }
    resolved = orjson.dumps({"type": "action.resolved", "action_id": "a1"})
    assert assigned_frame(_who("bob"), resolved) == resolved


def test_progress_of_a_pending_action_is_announced_again() -> None:
    before = {"a1": {"id": "a1", "thread_version": 3, "approval": {"decisions": []}}}
    moved = {"a1": {"id": "a1", "thread_version": 4, "approval": {"decisions": ["bob"]}}}
    frames = inbox_frames("acme", "t1", 4, before, moved)
    assert [f["type"] for f in frames] == ["action.pending"]
    # Only the thread's version moved: nothing to say.
    bumped = {"a1": {**before["a1"], "thread_version": 9}}
    assert inbox_frames("acme", "t1", 9, before, bumped) == []


def test_a_stored_approval_state_reads_back() -> None:
    # Stored parts carry the computed `approvals` and `needed`: reading them back must work
    # (a suspended routed tool failed its run with "Extra inputs are not permitted").
    state = _action("a1", decided_by=("bob",)).approval
    assert state is not None
    stored = state.model_dump(mode="json")
    assert stored["approvals"] == 1 and stored["needed"] == 1
    assert ApprovalState.model_validate(stored) == state


def test_both_client_surfaces_take_assigned() -> None:
    for method in (
        ThreadlineClient.pending,
        ThreadlineClient.watch_actions,
        SyncThreadlineClient.watch_actions,
        SyncThreadlineClient.pending.method,
    ):
        assert "assigned" in inspect.signature(method).parameters, method
