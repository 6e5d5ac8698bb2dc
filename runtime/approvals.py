"""Approval policies: who may decide a suspended tool's action, how many must, and their record."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

from runtime.errors import (
    AlreadyDecided,
    DelegationNotAllowed,
    Forbidden,
    InvalidInput,
    NotADecider,
    RequesterExcluded,
)
from threadline_wire import approval_progress as wire

RoleName = Literal["user", "backend", "admin"]
_COMPUTED = frozenset({"approvals", "needed"})


class Deciders(wire.DecidersView):
    """Who may decide at one stage: a role from `roles` (empty: any role the step allows) and,
    when `subjects` or `groups` are set, one of `subjects` or a member of one of `groups`."""

    # The wire's `DecidersView` (threadline_wire.approval_progress), strict: known roles only.

    model_config = ConfigDict(frozen=True, extra="forbid")

    roles: tuple[RoleName, ...] = ()


class Escalation(Deciders):
    """A later stage: when the stage before it is due, the action moves to these deciders,
    due again `deadline` seconds later."""

    deadline: float = Field(gt=0, le=366 * 86400)


ExpiryOutcome = Literal["deny", "approve"]


class ApprovalPolicy(Deciders):
    """Declared on a `SuspendStep` (`SuspendStep(Approval, policy=ApprovalPolicy(quorum=2))`).

    A decider must hold one of `roles` (empty: any role the step allows) and, when `subjects` or
    `groups` are set, be one of `subjects` or belong to one of `groups` (the principal's groups).
    `quorum` distinct deciders must approve; any denial ends the action at once. With
    `exclude_requester`, the run's starter (the author of the message that caused it) may not
    decide (four-eyes): refused with 403 `requester_excluded`.

    With `deadline` (seconds, database time), stage 0 (these deciders) is due that long after
    the action was asked for; then the next of `escalations` takes over with its own deadline,
    and once the last stage is due the action ends by `on_expiry`: `deny` (the tool never
    runs; the model sees a rejection with `expiry_reason`) or `approve` (the tool runs with
    `approve_payload`, the reason recorded). Decisions made so far count at every stage. With
    `delegation`, a current decider may hand the action to a subject or group
    (`action.reassign`).
    """

    quorum: int = Field(default=1, ge=1, le=100)
    exclude_requester: bool = False
    deadline: float | None = Field(default=None, gt=0, le=366 * 86400)
    escalations: tuple[Escalation, ...] = Field(default=(), max_length=20)
    on_expiry: ExpiryOutcome = "deny"
    expiry_reason: str = Field(default="", max_length=500)
    approve_payload: dict[str, Any] = Field(default_factory=dict)
    delegation: bool = False

    @model_validator(mode="after")
    def _escalations_need_a_deadline(self) -> ApprovalPolicy:
        if self.escalations and self.deadline is None:
            raise ValueError("escalations need a deadline for the first stage")
        return self

    def stage_deciders(self, stage: int) -> Deciders:
        """The deciders of `stage` (0: the policy's own; n: its n-th escalation)."""
        source: Deciders = self if stage == 0 else self.escalations[stage - 1]
        return Deciders(roles=source.roles, subjects=source.subjects, groups=source.groups)

    def stage_deadline(self, stage: int) -> float | None:
        return self.deadline if stage == 0 else self.escalations[stage - 1].deadline


class ApprovalDecision(wire.ApprovalDecisionView):
    """One decider's committed decision: its record in the action's progress and in what the
    tool is handed on resume (`ToolContext.decisions`)."""

    # The wire's `ApprovalDecisionView`, strict.

    model_config = ConfigDict(frozen=True, extra="forbid")


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
    # Who may decide now when not the stage's deciders: set by a reassignment.
    assigned: Deciders | None = None

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
    def deciders(self) -> Deciders:
        """Who may decide now: the reassigned deciders, else the current stage's."""
        return self.assigned or self.policy.stage_deciders(self.stage)

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
    deciders = state.deciders
    if deciders.roles and role not in deciders.roles:
        raise NotADecider(f"role {role} may not decide this action")
    if not deciders.admits(subject, role, groups):
        raise NotADecider(
            f"only {deciders.label()} may decide this action now (stage {state.stage})"
        )
    if state.decided_by(subject) is not None:
        raise AlreadyDecided(f"{subject} has decided this action already")


# --- deadlines (pure: the approval timer applies them in its transaction) -------------------


class DeadlineMove(BaseModel):
    """What a due deadline does to an action: `escalate` to `state` (its next stage, due
    again), or end it by the policy's `on_expiry` (`deny` / `approve`), with the reason."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["escalate", "deny", "approve"]
    state: ApprovalState
    reason: str


def armed(state: ApprovalState, now: float) -> ApprovalState | None:
    """The state with its first deadline set (`now`: the database clock of the transaction
    that suspends the action); None when the policy has none or it is armed already."""
    if state.due_at is not None or state.policy.deadline is None:
        return None
    label = state.waiting_for or state.deciders.label()
    return state.model_copy(update={"due_at": now + state.policy.deadline, "waiting_for": label})


def deadline_move(state: ApprovalState, now: float) -> DeadlineMove:
    """The transition of a due action: the next escalation stage (its deciders, a new
    deadline; a reassignment ends with the stage) or, after the last stage, the expiry."""
    policy = state.policy
    stage = state.stage + 1
    if stage <= len(policy.escalations):
        deciders = policy.stage_deciders(stage)
        deadline = policy.stage_deadline(stage)
        assert deadline is not None
        moved = state.model_copy(
            update={
                "stage": stage,
                "due_at": now + deadline,
                "waiting_for": deciders.label(),
                "assigned": None,
            }
        )
        reason = f"no decision by stage {state.stage}'s deadline; escalated to {moved.waiting_for}"
        return DeadlineMove(kind="escalate", state=moved, reason=reason)
    ended = state.model_copy(update={"due_at": None})
    default = "approved" if policy.on_expiry == "approve" else "denied"
    reason = policy.expiry_reason or f"no decision by the deadline: {default} automatically"
    return DeadlineMove(kind=policy.on_expiry, state=ended, reason=reason)


# --- reassignment --------------------------------------------------------------------------


class Reassignment(BaseModel):
    """Who hands an action on (`subject` with `role`, `groups`) and to whom: one subject or
    one group."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    subject: str
    role: str
    groups: frozenset[str] = frozenset()
    display_name: str
    to_subject: str | None = None
    to_group: str | None = None


def reassigned(
    state: ApprovalState,
    subject: str,
    role: str,
    groups: frozenset[str],
    *,
    to_subject: str | None,
    to_group: str | None,
) -> ApprovalState:
    """The state after `subject` (a current decider) hands the action to one subject or one
    group: they are its deciders until the stage ends (an escalation replaces them), under the
    current stage's roles; quorum, four-eyes and the decisions so far stay. 403
    `delegation_not_allowed` unless the policy permits delegation; `requester_excluded` or
    `not_a_decider` for a caller who may not decide now."""
    if not state.policy.delegation:
        raise DelegationNotAllowed("this action's policy does not permit delegation")
    if (to_subject is None) == (to_group is None):
        raise InvalidInput("name exactly one of 'to_subject' and 'to_group'")
    policy = state.policy
    if policy.exclude_requester and state.requester is not None and subject == state.requester:
        raise RequesterExcluded("the requester of this action may not reassign it (four-eyes)")
    current = state.deciders
    if not current.admits(subject, role, groups):
        raise NotADecider(f"only {current.label()} may reassign this action now")
    target = Deciders(
        roles=current.roles,
        subjects=() if to_subject is None else (to_subject,),
        groups=() if to_group is None else (to_group,),
    )
    return state.model_copy(update={"assigned": target, "waiting_for": target.label()})
