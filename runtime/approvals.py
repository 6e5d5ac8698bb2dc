"""Approval policies: who may decide a suspended tool's action, how many must, and their record."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

from runtime.errors import AlreadyDecided, Forbidden, NotADecider, RequesterExcluded

RoleName = Literal["user", "backend", "admin"]
_COMPUTED = frozenset({"approvals", "needed"})


class ApprovalPolicy(BaseModel):
    """Declared on a `SuspendStep` (`SuspendStep(Approval, policy=ApprovalPolicy(quorum=2))`).

    A decider must hold one of `roles` (empty: any role the step allows) and, when `subjects` or
    `groups` are set, be one of `subjects` or belong to one of `groups` (the principal's groups).
    `quorum` distinct deciders must approve; any denial ends the action at once. With
    `exclude_requester`, the run's starter (the author of the message that caused it) may not
    decide (four-eyes): refused with 403 `requester_excluded`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    quorum: int = Field(default=1, ge=1, le=100)
    roles: tuple[RoleName, ...] = ()
    subjects: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    exclude_requester: bool = False


class ApprovalDecision(BaseModel):
    """One decider's committed decision: its record in the action's progress and in what the
    tool is handed on resume (`ToolContext.decisions`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    subject: str
    display_name: str
    approved: bool
    payload: dict[str, Any]
    at: float


class ApprovalState(BaseModel):
    """An action's policy and its progress, kept in the waiting tool part: committed with each
    decision, so every snapshot shows who decided so far and how many approvals are needed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: ApprovalPolicy
    requester: str | None = None
    decisions: tuple[ApprovalDecision, ...] = ()
    # Deadlines and escalation (set by the approval timers when a policy has a deadline):
    # when the current stage is due (database time), which stage, and who is waited for.
    due_at: float | None = None
    stage: int = 0
    waiting_for: str = ""

    @model_validator(mode="before")
    @classmethod
    def _computed_are_not_input(cls, data: Any) -> Any:
        # A stored or wire form carries the computed fields too; they are derived, not read.
        if isinstance(data, dict) and _COMPUTED & data.keys():
            return {k: v for k, v in data.items() if k not in _COMPUTED}
        return data

    @computed_field  # type: ignore[prop-decorator]
    @property
    def approvals(self) -> int:
        return sum(1 for d in self.decisions if d.approved)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def needed(self) -> int:
        return max(0, self.policy.quorum - self.approvals)

    def decided_by(self, subject: str) -> ApprovalDecision | None:
        return next((d for d in self.decisions if d.subject == subject), None)

    def with_decision(self, decision: ApprovalDecision) -> ApprovalState:
        return self.model_copy(update={"decisions": (*self.decisions, decision)})

    @property
    def settled(self) -> bool:
        """The policy is met (quorum approvals) or refused (one denial): the action resolves."""
        return self.needed == 0 or any(not d.approved for d in self.decisions)


def approval_from_wire(data: dict[str, Any]) -> ApprovalState:
    """An `ApprovalState` from its wire form (which also carries the computed fields, and may
    carry fields of a newer server: those are left out)."""
    known = ApprovalState.model_fields.keys()
    return ApprovalState.model_validate({k: v for k, v in data.items() if k in known})


def decide_refusal(
    allowed_roles: Collection[str],
    state: ApprovalState | None,
    subject: str,
    role: str,
    groups: frozenset[str],
) -> str | None:
    """Why this caller may not decide an action now (an error code: `forbidden`,
    `requester_excluded`, `not_a_decider`, `already_decided`), or None when it may: what the
    inbox's `assigned=me` keeps and what a card shows, by the rules `check_eligible` enforces."""
    if role not in allowed_roles:
        return Forbidden.code
    if state is None:
        return None
    try:
        check_eligible(state, subject, role, groups)
    except (RequesterExcluded, NotADecider, AlreadyDecided) as exc:
        return exc.code
    return None


def check_eligible(state: ApprovalState, subject: str, role: str, groups: frozenset[str]) -> None:
    """Raise unless `subject` (with `role` and `groups`) may decide now: 403 `requester_excluded`
    or `not_a_decider`, 409 `already_decided` (distinct deciders: one decision each)."""
    policy = state.policy
    if policy.exclude_requester and state.requester is not None and subject == state.requester:
        raise RequesterExcluded("the requester of this action may not decide it (four-eyes)")
    if policy.roles and role not in policy.roles:
        raise NotADecider(f"role {role} may not decide this action")
    if (policy.subjects or policy.groups) and not (
        subject in policy.subjects or groups & set(policy.groups)
    ):
        raise NotADecider("only the subjects or groups the policy names may decide this action")
    if state.decided_by(subject) is not None:
        raise AlreadyDecided(f"{subject} has decided this action already")
