"""An approval's policy and progress as the wire carries them (a pending action's `approval`).

Lenient here (`extra="allow"`), so a client reads a newer server's fields; `runtime.approvals`
extends `DecidersView` and `ApprovalDecisionView` strictly and keeps the policy's rules.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class _WireApproval(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class DecidersView(_WireApproval):
    """Who may decide at one stage: a role from `roles` (empty: any role the step allows) and,
    when `subjects` or `groups` are set, one of `subjects` or a member of one of `groups`."""

    roles: tuple[str, ...] = ()
    subjects: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()

    def label(self) -> str:
        """Who is waited for, as a card shows it ("group finance", "alice, bob", "admin")."""
        named = [f"group {g}" for g in self.groups] + list(self.subjects)
        return ", ".join(named or list(self.roles) or ["anyone allowed"])

    def admits(self, subject: str, role: str, groups: frozenset[str]) -> bool:
        if self.roles and role not in self.roles:
            return False
        return not (self.subjects or self.groups) or (
            subject in self.subjects or bool(groups & set(self.groups))
        )


class EscalationView(DecidersView):
    """A later stage: the deciders the action moves to when the stage before it is due."""

    deadline: float


class ApprovalPolicyView(DecidersView):
    """A tool's approval policy as a pending action shows it (`runtime.approvals` documents
    each field): `quorum` approvals needed, stage deadlines and escalations, expiry outcome."""

    quorum: int = 1
    exclude_requester: bool = False
    deadline: float | None = None
    escalations: tuple[EscalationView, ...] = ()
    on_expiry: str = "deny"
    expiry_reason: str = ""
    approve_payload: dict[str, Any] = {}
    delegation: bool = False


class ApprovalDecisionView(_WireApproval):
    """One decider's committed decision."""

    subject: str
    display_name: str
    approved: bool
    payload: dict[str, Any]
    at: float


class ApprovalProgress(_WireApproval):
    """A pending action's `approval`: its policy, the decisions so far, how many approvals it
    has and still needs, the current stage, when it is due (database time), who is waited for
    and, after a reassignment, who may decide now (`assigned`)."""

    policy: ApprovalPolicyView
    requester: str | None = None
    decisions: tuple[ApprovalDecisionView, ...] = ()
    due_at: float | None = None
    stage: int = 0
    waiting_for: str = ""
    assigned: DecidersView | None = None
    approvals: int = 0
    needed: int = 0


__all__ = [
    "ApprovalDecisionView",
    "ApprovalPolicyView",
    "ApprovalProgress",
    "DecidersView",
    "EscalationView",
]
