"""The store's decisions as pure functions, with no I/O: any backend reuses them as they are."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

from runtime.approvals import ApprovalDecision
from runtime.domain import (
    InputPolicy,
    Lease,
    LeaseKind,
    MessageRole,
    Part,
    Resolution,
    RunStatus,
    ToolCallPart,
    ToolState,
    check_tool_transition,
)
from runtime.errors import (
    ActionConflict,
    AlreadyDecided,
    Conflict,
    Forbidden,
    InvalidInput,
    InvariantViolation,
    NotFound,
    RunActive,
    VersionMismatch,
)


def has_pending(parts: Iterable[Part]) -> bool:
    return any(isinstance(part, ToolCallPart) and part.is_pending for part in parts)


# --- admission ------------------------------------------------------------------------------


class AdmissionAction(StrEnum):
    """What a send does, once it is known not to repeat an earlier `client_request_id`."""

    START_RUN = "start_run"  # append the user message and queue a run for it
    ENQUEUE = "enqueue"  # queue the input behind the active run
    INTERRUPT = "interrupt"  # queue it and ask the active run to stop
    REJECT = "reject"  # refuse: `run_active`


def admission_action(active_run_id: str | None, policy: InputPolicy) -> AdmissionAction:
    """Input never lands in a thread with an active run: without one it starts a run, with one
    the input policy decides between queueing, queueing with a stop request, and refusing."""
    if active_run_id is None:
        return AdmissionAction.START_RUN
    if policy is InputPolicy.REJECT:
        return AdmissionAction.REJECT
    if policy is InputPolicy.INTERRUPT:
        return AdmissionAction.INTERRUPT
    return AdmissionAction.ENQUEUE


# --- tail-message invariant ---------------------------------------------------------------


def check_append(tail_id: str | None, tail_parts: Sequence[Part]) -> None:
    """Nothing may be appended after a tail that still holds a pending action."""
    if tail_id is not None and has_pending(tail_parts):
        raise InvariantViolation(
            f"message {tail_id} holds a pending action; nothing may be appended after it"
        )


def check_tail_rewrite(old: Sequence[Part], new: Sequence[Part]) -> None:
    """Tool parts of the tail only move forward, and a committed resolution is never undone
    (it may have been written by a concurrent resolve since the worker last read the tail)."""
    before = {part.tool_call_id: part for part in old if isinstance(part, ToolCallPart)}
    for part in new:
        if not isinstance(part, ToolCallPart) or part.tool_call_id not in before:
            continue
        stored = before[part.tool_call_id]
        if stored.state is not part.state:
            check_tool_transition(stored.state, part.state)
        resolved = stored.waiting is not None and stored.waiting.resolution is not None
        if (
            resolved
            and part.is_pending
            and part.waiting is not None
            and stored.waiting is not None
            and part.waiting.action_id == stored.waiting.action_id
        ):
            raise InvariantViolation(
                f"tool call {part.tool_call_id} was already resolved; the update would undo it"
            )


def keep_approvals(old: Sequence[Part], new: Sequence[Part]) -> list[Part]:
    """`new` with each still-pending action's approval state as stored: a worker's tail update
    carries the state it read, while decisions, deadlines, escalations and reassignments are
    committed beside it (under the thread lock) and must not be undone or re-armed."""
    stored = {
        part.waiting.action_id: part.waiting.approval
        for part in old
        if isinstance(part, ToolCallPart) and part.waiting is not None and part.is_pending
    }
    kept: list[Part] = []
    for part in new:
        if (
            isinstance(part, ToolCallPart)
            and part.is_pending
            and part.waiting is not None
            and stored.get(part.waiting.action_id) is not None
            and stored[part.waiting.action_id] != part.waiting.approval
        ):
            waiting = part.waiting.model_copy(update={"approval": stored[part.waiting.action_id]})
            part = part.model_copy(update={"waiting": waiting})
        kept.append(part)
    return kept


def check_tail_update(
    thread_id: str,
    message_id: str,
    tail_id: str | None,
    tail_parts: Sequence[Part],
    new_parts: Sequence[Part],
) -> None:
    """Only the tail message may be updated, and only forward (`check_tail_rewrite`)."""
    if tail_id is None or tail_id != message_id:
        raise InvariantViolation(
            f"message {message_id} is not the tail of thread {thread_id};"
            " only the tail message may be updated"
        )
    check_tail_rewrite(tail_parts, new_parts)


def cancel_waiting(parts: Sequence[Part]) -> tuple[list[Part], bool]:
    """Parts with every still-awaiting tool part cancelled (terminal tool finalisation)."""
    changed = False
    result: list[Part] = []
    for part in parts:
        if isinstance(part, ToolCallPart) and part.state is ToolState.AWAITING_ACTION:
            part = part.transition(ToolState.CANCELLED, error=part.error or "run ended")
            changed = True
        result.append(part)
    return result, changed


@dataclass(frozen=True, slots=True)
class RunTargetPlan:
    """How a run transition meets the tail: apply the status or leave it, and the tail parts
    to write first (None: the tail stays as it is)."""

    apply_status: bool
    tail_parts: list[Part] | None = None


def plan_run_target(
    run_id: str, target: RunStatus, tail_run_id: str | None, tail_parts: Sequence[Part]
) -> RunTargetPlan:
    """Keep pending actions and the run status consistent.

    A waiting run must have something to wait for. If every action of its tail was resolved
    between the commit that suspended them and this transition, the run stays `running`
    (runnable, so a worker resumes it) instead of waiting for nothing. An ending run leaves no
    action awaiting in its tail. `tail_run_id` is the run that wrote the tail (None: no tail
    or a message of nobody's run).
    """
    own_tail = tail_run_id is not None and tail_run_id == run_id
    if target is RunStatus.WAITING:
        if own_tail and has_pending(tail_parts):
            return RunTargetPlan(apply_status=True)
        if own_tail and any(
            isinstance(part, ToolCallPart) and part.state is ToolState.AWAITING_ACTION
            for part in tail_parts
        ):
            return RunTargetPlan(apply_status=False)
        raise InvariantViolation(
            f"run {run_id} cannot wait: its tail message holds no pending action"
        )
    if target.is_terminal and own_tail:
        finalised, changed = cancel_waiting(tail_parts)
        return RunTargetPlan(apply_status=True, tail_parts=finalised if changed else None)
    return RunTargetPlan(apply_status=True)


def check_commit(run_id: str, status: RunStatus) -> None:
    if status.is_terminal:
        raise InvariantViolation(f"run {run_id} already ended ({status})")


def check_run_message(run_id: str, message_run_id: str | None) -> None:
    if message_run_id is not None and message_run_id != run_id:
        raise InvariantViolation(f"run {run_id} cannot append a message of run {message_run_id}")


def next_seq_changes(stored: int, requested: int | None) -> bool:
    """Whether a commit moves `next_seq`; it never goes back (committed chunks stay committed)."""
    if requested is None or requested == stored:
        return False
    if requested < stored:
        raise InvariantViolation(f"next_seq may not go back from {stored} to {requested}")
    return True


# --- runs and leases --------------------------------------------------------------------


class StopOutcome(StrEnum):
    CANCEL_NOW = "cancel_now"  # never started: the stop itself ends the run
    FLAG = "flag"  # an owner exists or will: it finalises the run
    NOTHING = "nothing"  # already ended, or already asked to stop


def stop_outcome(status: RunStatus, stop_requested: bool, leased: bool) -> StopOutcome:
    # A queued run under a live lease is being started; its worker handles the stop.
    if status is RunStatus.QUEUED and not leased:
        return StopOutcome.CANCEL_NOW
    if status.is_active and not stop_requested:
        return StopOutcome.FLAG
    return StopOutcome.NOTHING


def episode_status(status: RunStatus) -> RunStatus | None:
    """The status a new episode runs in; None when the run ended after its lease was taken."""
    if status.is_terminal:
        return None
    return RunStatus.RUNNING if status is RunStatus.QUEUED else status


def run_leasable(status: RunStatus, stop_requested: bool) -> bool:
    """A waiting run has nothing to do until resolved, unless it must be finalised for a stop."""
    if status.is_terminal:
        return False
    return status is not RunStatus.WAITING or stop_requested


def lease_free(expires_at: float | None, now: float) -> bool:
    return expires_at is None or expires_at <= now


class StoredLease(NamedTuple):
    thread_id: str
    token: int
    expires_at: float


def lease_holds(lease: Lease, stored: StoredLease | None, now: float) -> bool:
    """The fence: the stored lease still carries this token for this thread and has not
    expired by the database clock (an admin lease's resource is its thread)."""
    if stored is None:
        return False
    if lease.kind is LeaseKind.ADMIN and lease.resource_id != lease.thread_id:
        return False
    return (
        stored.token == lease.token
        and stored.thread_id == lease.thread_id
        and stored.expires_at > now
    )


def check_lease_kind(lease: Lease, kind: LeaseKind) -> None:
    if lease.kind is not kind:
        raise InvalidInput(f"this write needs a {kind} lease, not a {lease.kind} lease")


# --- pending actions (compare-and-set) ----------------------------------------------------


def check_expected_version(thread_id: str, current: int, expected: int | None) -> None:
    if expected is not None and expected != current:
        raise VersionMismatch(
            f"thread {thread_id} is at version {current}, not {expected}",
            current_version=current,
        )


def find_action(parts: Sequence[Part], action_id: str) -> int | None:
    for index, part in enumerate(parts):
        if (
            isinstance(part, ToolCallPart)
            and part.waiting is not None
            and part.waiting.action_id == action_id
        ):
            return index
    return None


def action_ids(parts: Sequence[Part]) -> list[str]:
    """Every action id in `parts`, pending or resolved (what the action index records)."""
    return [
        part.waiting.action_id
        for part in parts
        if isinstance(part, ToolCallPart) and part.waiting is not None
    ]


def action_conflict(action_id: str, part: ToolCallPart) -> ActionConflict:
    """The conflict a late resolution gets: it names the winner when there is one."""
    resolution = part.waiting.resolution if part.waiting is not None else None
    if resolution is not None:
        message = f"action {action_id} was already resolved by {resolution.subject}"
    else:
        message = f"action {action_id} is no longer awaiting a resolution ({part.state})"
    return ActionConflict(
        message,
        resolved_by=None if resolution is None else resolution.subject,
        state=part.state.value,
    )


@dataclass(frozen=True, slots=True)
class ResolvedAction:
    parts: tuple[Part, ...]
    # No pending action is left in the message: its waiting run becomes runnable again.
    last_pending: bool
    # The decision this resolution added under an approval policy (None: no policy).
    decision: ApprovalDecision | None = None
    # False: the decision was recorded, the policy is not met yet, the action stays pending.
    settled: bool = True


def resolve_action(
    parts: Sequence[Part], action_id: str, resolution: Resolution
) -> ResolvedAction | None:
    """Compare-and-set on the tail's parts: None when the action is not in them; a conflict
    naming the winner when it is no longer pending; Forbidden for a role it does not allow."""
    index = find_action(parts, action_id)
    if index is None:
        return None
    part = parts[index]
    assert isinstance(part, ToolCallPart) and part.waiting is not None
    if not part.is_pending:
        raise action_conflict(action_id, part)
    if resolution.role not in part.waiting.allowed_roles:
        raise Forbidden(f"role {resolution.role} may not resolve action {action_id}")
    waiting = part.waiting
    decision = resolution.decision
    if waiting.approval is not None and decision is not None:
        # Under the thread lock: of two concurrent decisions of one decider the second
        # conflicts, and only the decision that meets the policy resolves the action.
        if waiting.approval.decided_by(decision.subject) is not None:
            raise AlreadyDecided(f"{decision.subject} has decided action {action_id} already")
        approval = waiting.approval.with_decision(decision)
        waiting = waiting.model_copy(update={"approval": approval})
        if not approval.settled:
            pending = part.model_copy(update={"waiting": waiting})
            new_parts = (*parts[:index], pending, *parts[index + 1 :])
            return ResolvedAction(new_parts, False, decision=decision, settled=False)
        resolution = resolution.model_copy(update={"decisions": approval.decisions})
    resolved = part.model_copy(
        update={"waiting": waiting.model_copy(update={"resolution": resolution})}
    )
    new_parts = (*parts[:index], resolved, *parts[index + 1 :])
    return ResolvedAction(
        parts=new_parts, last_pending=not has_pending(new_parts), decision=decision
    )


def stale_action_error(
    older: Iterable[Sequence[Part]], action_id: str
) -> ActionConflict | NotFound:
    """An action outside the tail can no longer be resolved: a conflict if some older message
    holds it (newest first), NotFound otherwise."""
    for parts in older:
        index = find_action(parts, action_id)
        if index is not None:
            part = parts[index]
            assert isinstance(part, ToolCallPart)
            return action_conflict(action_id, part)
    return NotFound(f"action {action_id} not found")


# --- history rewrites -------------------------------------------------------------------


class MessageRef(NamedTuple):
    id: str
    position: int
    role: MessageRole


@dataclass(frozen=True, slots=True)
class TruncatePlan:
    from_position: int
    removed_ids: tuple[str, ...]
    # The last user message that remains: the regenerate run answers it.
    input_message_id: str


def check_retryable(run_id: str, latest_run_id: str | None, latest_status: str | None) -> None:
    """Only the thread's latest run may be retried, and only once it failed or was cancelled."""
    if latest_run_id != run_id:
        raise Conflict(f"run {run_id} is not the thread's latest run; only it can be retried")
    if latest_status not in (RunStatus.FAILED, RunStatus.CANCELLED):
        raise Conflict(f"run {run_id} is {latest_status}; only failed or cancelled runs retry")


def check_rewrite_allowed(thread_id: str, active_run_id: str | None) -> None:
    if active_run_id is not None:
        raise RunActive(
            f"thread {thread_id} has an active run; history cannot be rewritten",
            run_id=active_run_id,
        )


def plan_truncate(messages: Sequence[MessageRef], from_message_id: str) -> TruncatePlan:
    """Regenerate: remove `from_message_id` and everything after it, answer the last user
    message before it again."""
    ordered = sorted(messages, key=lambda ref: ref.position)
    start = next((ref for ref in ordered if ref.id == from_message_id), None)
    if start is None:
        raise NotFound(f"message {from_message_id} not found")
    kept = [ref for ref in ordered if ref.position < start.position]
    user = next((ref for ref in reversed(kept) if ref.role is MessageRole.USER), None)
    if user is None:
        raise InvalidInput("no user message remains before the truncation point")
    removed = tuple(ref.id for ref in ordered if ref.position >= start.position)
    return TruncatePlan(from_position=start.position, removed_ids=removed, input_message_id=user.id)


def merge_patch(current: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any] | None:
    """Shallow merge of a metadata patch; None when there is nothing to write."""
    if not patch:
        return None
    return {**current, **patch}
