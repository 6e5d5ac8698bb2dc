"""Approval deadlines and reassignment as pure transitions: arming, each stage's escalation,
the expiry, and who may decide after each move."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from runtime.approvals import (
    ApprovalDecision,
    ApprovalPolicy,
    ApprovalState,
    Escalation,
    armed,
    deadline_move,
    decide_refusal,
    reassigned,
)
from runtime.domain import Role
from runtime.errors import DelegationNotAllowed

POLICY = ApprovalPolicy(
    groups=("ops",),
    quorum=2,
    deadline=60,
    escalations=(
        Escalation(groups=("finance",), deadline=30),
        Escalation(subjects=("cfo",), roles=("admin",), deadline=10),
    ),
    expiry_reason="nobody answered",
    delegation=True,
)


def _may(state: ApprovalState, subject: str, *groups: str, role: str = "user") -> bool:
    allowed = (Role.USER, Role.ADMIN)
    return decide_refusal(allowed, state, subject, role, frozenset(groups)) is None


def test_arming_sets_the_first_deadline_once() -> None:
    state = ApprovalState(policy=POLICY)
    first = armed(state, 1000.0)
    assert first is not None
    assert (first.due_at, first.stage, first.waiting_for) == (1060.0, 0, "group ops")
    assert armed(first, 2000.0) is None  # already armed: a rewrite of the part keeps it
    assert armed(ApprovalState(policy=ApprovalPolicy()), 1000.0) is None  # no deadline


def test_each_stage_escalates_then_the_last_expires() -> None:
    decision = ApprovalDecision(
        subject="olga", display_name="Olga", approved=True, payload={}, at=1
    )
    state = armed(ApprovalState(policy=POLICY, decisions=(decision,)), 1000.0)
    assert state is not None
    one = deadline_move(state, 1060.0)
    assert one.kind == "escalate"
    assert (one.state.stage, one.state.due_at, one.state.waiting_for) == (
        1,
        1090.0,
        "group finance",
    )
    assert one.state.decisions == (decision,)  # decisions so far count at every stage
    assert not _may(one.state, "oscar", "ops") and _may(one.state, "fay", "finance")
    two = deadline_move(one.state, 1090.0)
    assert (two.kind, two.state.stage, two.state.due_at) == ("escalate", 2, 1100.0)
    assert two.state.waiting_for == "cfo"
    assert _may(two.state, "cfo", role="admin") and not _may(two.state, "cfo", role="user")
    end = deadline_move(two.state, 1100.0)
    assert (end.kind, end.reason, end.state.due_at) == ("deny", "nobody answered", None)


def test_auto_approve_and_the_default_reason() -> None:
    policy = ApprovalPolicy(deadline=5, on_expiry="approve", approve_payload={"approved": True})
    move = deadline_move(ApprovalState(policy=policy, due_at=5.0), 5.0)
    assert (move.kind, move.reason) == (
        "approve",
        "no decision by the deadline: approved automatically",
    )


def test_a_reassignment_routes_until_the_stage_ends() -> None:
    state = armed(ApprovalState(policy=POLICY, requester="alice"), 0.0)
    assert state is not None
    handed = reassigned(state, "olga", "user", frozenset({"ops"}), to_subject="zed", to_group=None)
    assert handed.waiting_for == "zed" and handed.due_at == state.due_at
    assert _may(handed, "zed") and not _may(handed, "olga", "ops")
    assert deadline_move(handed, 60.0).state.assigned is None  # the escalation replaces it
    with pytest.raises(DelegationNotAllowed):
        reassigned(
            ApprovalState(policy=ApprovalPolicy()),
            "olga",
            "user",
            frozenset(),
            to_subject="zed",
            to_group=None,
        )


def test_escalations_need_a_first_deadline() -> None:
    with pytest.raises(ValidationError, match="escalations need a deadline"):
        ApprovalPolicy(escalations=(Escalation(deadline=5),))
