"""Approval policies: a quorum of distinct deciders, denial ends it, four-eyes; the audit chain."""

from __future__ import annotations

import pytest

from runtime.approvals import ApprovalDecision, ApprovalPolicy, ApprovalState, check_eligible
from runtime.domain import Resolution, Role, ToolCallPart, ToolState, Waiting, WaitKind
from runtime.errors import AlreadyDecided, NotADecider, RequesterExcluded
from runtime.storage.audit_chain import AuditEntry, entry_hash, payload_hash, verify
from runtime.storage.decisions import resolve_action


def _part(policy: ApprovalPolicy) -> ToolCallPart:
    waiting = Waiting(
        action_id="a1",
        kind=WaitKind.APPROVAL,
        payload_schema={},
        allowed_roles=(Role.USER, Role.BACKEND, Role.ADMIN),
        approval=ApprovalState(policy=policy, requester="alice"),
    )
    return ToolCallPart(
        tool_call_id="c1", name="refund", state=ToolState.AWAITING_ACTION, waiting=waiting
    )


def _decide(subject: str, approved: bool = True) -> Resolution:
    payload = {"approved": approved}
    decision = ApprovalDecision(
        subject=subject, display_name=subject.title(), approved=approved, payload=payload, at=1.0
    )
    return Resolution(subject=subject, role=Role.USER, payload=payload, at=1.0, decision=decision)


def test_quorum_of_two_distinct_deciders_resolves_once() -> None:
    parts: tuple[ToolCallPart, ...] = (_part(ApprovalPolicy(quorum=2)),)
    first = resolve_action(parts, "a1", _decide("bob"))
    assert first is not None and not first.settled and not first.last_pending
    pending = first.parts[0]
    assert isinstance(pending, ToolCallPart) and pending.is_pending
    assert pending.waiting is not None and pending.waiting.approval is not None
    assert pending.waiting.approval.needed == 1
    with pytest.raises(AlreadyDecided):
        resolve_action(first.parts, "a1", _decide("bob"))
    second = resolve_action(first.parts, "a1", _decide("carol"))
    assert second is not None and second.settled and second.last_pending
    done = second.parts[0]
    assert isinstance(done, ToolCallPart) and not done.is_pending
    assert done.waiting is not None and done.waiting.resolution is not None
    assert [d.subject for d in done.waiting.resolution.decisions] == ["bob", "carol"]


def test_a_denial_ends_the_action_before_the_quorum() -> None:
    parts = (_part(ApprovalPolicy(quorum=3)),)
    outcome = resolve_action(parts, "a1", _decide("bob", approved=False))
    assert outcome is not None and outcome.settled and outcome.last_pending


def test_eligibility_four_eyes_roles_subjects_groups() -> None:
    state = ApprovalState(
        policy=ApprovalPolicy(exclude_requester=True, groups=("finance",), subjects=("dave",)),
        requester="alice",
    )
    with pytest.raises(RequesterExcluded):
        check_eligible(state, "alice", "user", frozenset({"finance"}))
    with pytest.raises(NotADecider):
        check_eligible(state, "bob", "user", frozenset({"sales"}))
    check_eligible(state, "bob", "user", frozenset({"finance"}))
    check_eligible(state, "dave", "user", frozenset())
    with pytest.raises(NotADecider):
        check_eligible(
            ApprovalState(policy=ApprovalPolicy(roles=("admin",))), "bob", "user", frozenset()
        )


def _chain(n: int) -> list[AuditEntry]:
    entries, prev = [], ""
    for seq in range(1, n + 1):
        fields = {
            "scope": "s",
            "seq": seq,
            "event": "action.approved",
            "thread_id": "t",
            "action_id": "a",
            "subject": f"u{seq}",
            "token_id": "k",
            "display_name": f"U{seq}",
            "transport": "http",
            "client_address": "127.0.0.1",
            "user_agent": "test",
            "at": 1.5 + seq,
            "detail": "approved",
            "payload_hash": payload_hash({"approved": True}),
            "prev_hash": prev,
        }
        entry = AuditEntry(**fields, hash=entry_hash(fields))
        entries.append(entry)
        prev = entry.hash
    return entries


def test_the_chain_names_the_first_edited_or_deleted_entry() -> None:
    entries = _chain(4)
    assert verify("s", entries).ok
    edited = [*entries]
    edited[1] = edited[1].model_copy(update={"subject": "mallory"})
    report = verify("s", edited)
    assert not report.ok and report.broken_seq == 2
    deleted = [entries[0], *entries[2:]]
    report = verify("s", deleted)
    assert not report.ok and report.broken_seq == 2
    assert not verify("s", entries[1:]).ok  # the first entry deleted
