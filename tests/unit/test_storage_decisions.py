"""Store decisions without a database: admission, the action compare-and-set, the tail-message
invariant, run transitions, stops, leases and the truncate plan."""

from __future__ import annotations

import pytest

from runtime.domain import (
    InputPolicy,
    Lease,
    LeaseKind,
    MessageRole,
    Part,
    Resolution,
    Role,
    RunStatus,
    TextPart,
    ToolCallPart,
    ToolState,
    Waiting,
    WaitKind,
)
from runtime.errors import (
    ActionConflict,
    Forbidden,
    IllegalTransition,
    InvalidInput,
    InvariantViolation,
    NotFound,
    RunActive,
    VersionMismatch,
)
from runtime.storage.decisions import (
    AdmissionAction,
    MessageRef,
    StopOutcome,
    StoredLease,
    admission_action,
    cancel_waiting,
    check_append,
    check_commit,
    check_expected_version,
    check_lease_kind,
    check_rewrite_allowed,
    check_run_message,
    check_tail_rewrite,
    check_tail_update,
    episode_status,
    lease_free,
    lease_holds,
    merge_patch,
    next_seq_changes,
    plan_run_target,
    plan_truncate,
    resolve_action,
    run_leasable,
    stale_action_error,
    stop_outcome,
)


def waiting(action_id: str = "act_1", roles: tuple[Role, ...] = (Role.USER,)) -> ToolCallPart:
    return ToolCallPart(
        tool_call_id=f"call_{action_id}",
        name="send_email",
        state=ToolState.AWAITING_ACTION,
        waiting=Waiting(
            action_id=action_id,
            kind=WaitKind.APPROVAL,
            payload_schema={"type": "object"},
            allowed_roles=roles,
        ),
    )


def resolution(subject: str = "alice", role: Role = Role.USER) -> Resolution:
    return Resolution(subject=subject, role=role, payload={"approved": True}, at=1.0)


def resolved(part: ToolCallPart, by: str = "alice") -> ToolCallPart:
    assert part.waiting is not None
    return part.model_copy(
        update={"waiting": part.waiting.model_copy(update={"resolution": resolution(by)})}
    )


TEXT = TextPart(text="hello")

# --- admission ------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", list(InputPolicy))
def test_idle_thread_starts_a_run_whatever_the_policy(policy: InputPolicy) -> None:
    assert admission_action(None, policy) is AdmissionAction.START_RUN


@pytest.mark.parametrize(
    ("policy", "action"),
    [
        (InputPolicy.ENQUEUE, AdmissionAction.ENQUEUE),
        (InputPolicy.INTERRUPT, AdmissionAction.INTERRUPT),
        (InputPolicy.REJECT, AdmissionAction.REJECT),
    ],
)
def test_active_run_lets_the_policy_decide(policy: InputPolicy, action: AdmissionAction) -> None:
    assert admission_action("run_1", policy) is action


# --- pending actions: compare-and-set -------------------------------------------------------


def test_first_resolution_wins_and_resumes_when_it_was_the_last_pending() -> None:
    outcome = resolve_action((TEXT, waiting()), "act_1", resolution("alice"))
    assert outcome is not None and outcome.last_pending
    part = outcome.parts[1]
    assert isinstance(part, ToolCallPart) and part.waiting is not None
    assert part.waiting.resolution == resolution("alice")
    assert outcome.parts[0] == TEXT


def test_resolution_with_another_action_still_pending_does_not_resume() -> None:
    outcome = resolve_action((waiting("a"), waiting("b")), "a", resolution())
    assert outcome is not None and not outcome.last_pending
    assert isinstance(outcome.parts[1], ToolCallPart) and outcome.parts[1].is_pending


def test_late_resolution_gets_a_conflict_naming_the_winner() -> None:
    with pytest.raises(ActionConflict) as caught:
        resolve_action((resolved(waiting(), by="alice"),), "act_1", resolution("bob"))
    assert caught.value.details["resolved_by"] == "alice"
    assert "alice" in str(caught.value)


def test_action_no_longer_awaiting_is_a_conflict_without_a_winner() -> None:
    cancelled = waiting().transition(ToolState.CANCELLED, error="run ended")
    with pytest.raises(ActionConflict) as caught:
        resolve_action((cancelled,), "act_1", resolution())
    assert caught.value.details["resolved_by"] is None
    assert caught.value.details["state"] == "cancelled"


def test_role_not_allowed_is_forbidden() -> None:
    with pytest.raises(Forbidden):
        resolve_action((waiting(roles=(Role.ADMIN,)),), "act_1", resolution(role=Role.USER))


def test_action_not_in_the_parts_is_not_decided_here() -> None:
    assert resolve_action((TEXT, waiting("other")), "act_1", resolution()) is None


def test_action_in_an_older_message_is_a_conflict_and_an_unknown_one_not_found() -> None:
    older: list[tuple[Part, ...]] = [(TEXT,), (resolved(waiting(), by="carol"),)]
    error = stale_action_error(iter(older), "act_1")
    assert isinstance(error, ActionConflict) and error.details["resolved_by"] == "carol"
    assert isinstance(stale_action_error(iter(older), "act_2"), NotFound)


def test_expected_version_must_match_when_given() -> None:
    check_expected_version("th", 4, None)
    check_expected_version("th", 4, 4)
    with pytest.raises(VersionMismatch) as caught:
        check_expected_version("th", 4, 3)
    assert caught.value.details["current_version"] == 4


# --- tail-message invariant -----------------------------------------------------------------


def test_append_is_refused_after_a_pending_tail_only() -> None:
    check_append(None, ())
    check_append("msg_1", (TEXT,))
    check_append("msg_1", (resolved(waiting()),))
    with pytest.raises(InvariantViolation):
        check_append("msg_1", (TEXT, waiting()))


def test_only_the_tail_may_be_updated() -> None:
    check_tail_update("th", "msg_2", "msg_2", (TEXT,), (TEXT, TEXT))
    with pytest.raises(InvariantViolation):
        check_tail_update("th", "msg_1", "msg_2", (TEXT,), (TEXT,))
    with pytest.raises(InvariantViolation):
        check_tail_update("th", "msg_1", None, (), (TEXT,))


def test_tail_rewrite_moves_tool_parts_forward_only() -> None:
    started = ToolCallPart(tool_call_id="c1", name="t", state=ToolState.RUNNING)
    done = started.transition(ToolState.OUTPUT_AVAILABLE, output=1)
    check_tail_rewrite((started,), (done,))
    check_tail_rewrite((started,), (started, TEXT))  # unchanged and new parts pass
    with pytest.raises(IllegalTransition):
        check_tail_rewrite((done,), (started,))


def test_tail_rewrite_never_undoes_a_committed_resolution() -> None:
    with pytest.raises(InvariantViolation):
        check_tail_rewrite((resolved(waiting()),), (waiting(),))
    # A stale copy of another action does not count as undoing this one.
    other = waiting("b").model_copy(update={"tool_call_id": "call_act_1"})
    check_tail_rewrite((resolved(waiting()),), (other,))


def test_run_may_append_only_its_own_messages() -> None:
    check_run_message("run_1", None)
    check_run_message("run_1", "run_1")
    with pytest.raises(InvariantViolation):
        check_run_message("run_1", "run_2")


def test_ended_run_takes_no_commit() -> None:
    check_commit("run_1", RunStatus.RUNNING)
    for status in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED):
        with pytest.raises(InvariantViolation):
            check_commit("run_1", status)


def test_next_seq_moves_forward_only() -> None:
    assert not next_seq_changes(5, None)
    assert not next_seq_changes(5, 5)
    assert next_seq_changes(5, 9)
    with pytest.raises(InvariantViolation):
        next_seq_changes(5, 4)


# --- run transitions against the tail -------------------------------------------------------


def test_waiting_needs_a_pending_action_in_the_runs_own_tail() -> None:
    plan = plan_run_target("run_1", RunStatus.WAITING, "run_1", (waiting(),))
    assert plan.apply_status and plan.tail_parts is None
    with pytest.raises(InvariantViolation):
        plan_run_target("run_1", RunStatus.WAITING, "run_2", (waiting(),))
    with pytest.raises(InvariantViolation):
        plan_run_target("run_1", RunStatus.WAITING, "run_1", (TEXT,))
    with pytest.raises(InvariantViolation):
        plan_run_target("run_1", RunStatus.WAITING, None, ())


def test_waiting_for_actions_already_resolved_keeps_the_run_running() -> None:
    plan = plan_run_target("run_1", RunStatus.WAITING, "run_1", (resolved(waiting()),))
    assert not plan.apply_status and plan.tail_parts is None


def test_ending_run_cancels_what_still_awaits_in_its_own_tail() -> None:
    plan = plan_run_target("run_1", RunStatus.CANCELLED, "run_1", (TEXT, waiting()))
    assert plan.apply_status and plan.tail_parts is not None
    part = plan.tail_parts[1]
    assert isinstance(part, ToolCallPart) and part.state is ToolState.CANCELLED
    assert part.error == "run ended"
    # Nothing awaiting, or somebody else's tail: the tail stays as it is.
    assert plan_run_target("run_1", RunStatus.COMPLETED, "run_1", (TEXT,)).tail_parts is None
    assert plan_run_target("run_1", RunStatus.FAILED, "run_2", (waiting(),)).tail_parts is None


def test_running_needs_no_tail_check() -> None:
    plan = plan_run_target("run_1", RunStatus.RUNNING, None, ())
    assert plan.apply_status and plan.tail_parts is None


def test_cancel_waiting_keeps_an_existing_error_and_reports_no_change_when_idle() -> None:
    erred = waiting().model_copy(update={"error": "timeout"})
    parts, changed = cancel_waiting((erred,))
    assert changed and isinstance(parts[0], ToolCallPart) and parts[0].error == "timeout"
    unchanged: tuple[Part, ...] = (TEXT,)
    assert cancel_waiting(unchanged) == ([TEXT], False)


# --- stops, episodes and leases -------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "stop_requested", "leased", "outcome"),
    [
        (RunStatus.QUEUED, False, False, StopOutcome.CANCEL_NOW),
        (RunStatus.QUEUED, True, False, StopOutcome.CANCEL_NOW),
        (RunStatus.QUEUED, False, True, StopOutcome.FLAG),
        (RunStatus.RUNNING, False, True, StopOutcome.FLAG),
        (RunStatus.WAITING, False, False, StopOutcome.FLAG),
        (RunStatus.RUNNING, True, True, StopOutcome.NOTHING),
        (RunStatus.COMPLETED, False, False, StopOutcome.NOTHING),
        (RunStatus.CANCELLED, False, True, StopOutcome.NOTHING),
    ],
)
def test_stop_outcome(
    status: RunStatus, stop_requested: bool, leased: bool, outcome: StopOutcome
) -> None:
    assert stop_outcome(status, stop_requested, leased) is outcome


def test_episode_status() -> None:
    assert episode_status(RunStatus.QUEUED) is RunStatus.RUNNING
    assert episode_status(RunStatus.RUNNING) is RunStatus.RUNNING
    assert episode_status(RunStatus.WAITING) is RunStatus.WAITING
    assert episode_status(RunStatus.FAILED) is None


def test_run_leasable() -> None:
    assert run_leasable(RunStatus.QUEUED, False)
    assert run_leasable(RunStatus.RUNNING, False)
    assert not run_leasable(RunStatus.WAITING, False)
    assert run_leasable(RunStatus.WAITING, True)
    assert not run_leasable(RunStatus.COMPLETED, True)


def test_lease_free_by_the_database_clock() -> None:
    assert lease_free(None, 10.0)
    assert lease_free(10.0, 10.0)
    assert not lease_free(10.5, 10.0)


def _lease(kind: LeaseKind = LeaseKind.RUN, resource: str = "run_1") -> Lease:
    return Lease(
        kind=kind, resource_id=resource, thread_id="th_1", owner="w", token=7, expires_at=20.0
    )


def test_lease_holds_only_with_its_token_thread_and_time() -> None:
    lease = _lease()
    assert lease_holds(lease, StoredLease("th_1", 7, 20.0), 10.0)
    assert not lease_holds(lease, None, 10.0)
    assert not lease_holds(lease, StoredLease("th_1", 8, 20.0), 10.0)  # taken over
    assert not lease_holds(lease, StoredLease("th_2", 7, 20.0), 10.0)
    assert not lease_holds(lease, StoredLease("th_1", 7, 20.0), 20.0)  # expired


def test_admin_lease_resource_is_its_thread() -> None:
    stored = StoredLease("th_1", 7, 20.0)
    assert lease_holds(_lease(LeaseKind.ADMIN, "th_1"), stored, 10.0)
    assert not lease_holds(_lease(LeaseKind.ADMIN, "th_2"), stored, 10.0)


def test_lease_kind_must_match_the_write() -> None:
    check_lease_kind(_lease(), LeaseKind.RUN)
    with pytest.raises(InvalidInput):
        check_lease_kind(_lease(), LeaseKind.ADMIN)


# --- history rewrites -----------------------------------------------------------------------

HISTORY = [
    MessageRef("m0", 0, MessageRole.USER),
    MessageRef("m1", 1, MessageRole.ASSISTANT),
    MessageRef("m2", 2, MessageRole.USER),
    MessageRef("m3", 3, MessageRole.ASSISTANT),
    MessageRef("m4", 4, MessageRole.ASSISTANT),
]


def test_truncate_removes_the_message_and_later_ones_and_answers_the_last_user_message() -> None:
    plan = plan_truncate(list(reversed(HISTORY)), "m3")
    assert plan.from_position == 3
    assert plan.removed_ids == ("m3", "m4")
    assert plan.input_message_id == "m2"


def test_truncate_from_a_user_message_answers_the_user_message_before_it() -> None:
    plan = plan_truncate(HISTORY, "m2")
    assert plan.removed_ids == ("m2", "m3", "m4") and plan.input_message_id == "m0"


def test_truncate_needs_a_known_message_and_a_user_message_before_it() -> None:
    with pytest.raises(NotFound):
        plan_truncate(HISTORY, "m9")
    with pytest.raises(InvalidInput):
        plan_truncate(HISTORY, "m0")


def test_rewrite_refused_during_an_active_run() -> None:
    check_rewrite_allowed("th", None)
    with pytest.raises(RunActive) as caught:
        check_rewrite_allowed("th", "run_1")
    assert caught.value.details["run_id"] == "run_1"


def test_metadata_patch_is_a_shallow_merge() -> None:
    assert merge_patch({"a": 1, "b": {"x": 1}}, {}) is None
    assert merge_patch({"a": 1, "b": {"x": 1}}, {"b": {"y": 2}, "c": 3}) == {
        "a": 1,
        "b": {"y": 2},
        "c": 3,
    }
