"""Domain model: guarded run and tool-part transitions, the Part union, pending actions."""

from __future__ import annotations

import itertools

import pytest
from pydantic import ValidationError

from runtime.domain import (
    MAX_TEXT_CHARS,
    Message,
    MessageRole,
    PartsAdapter,
    Resolution,
    Role,
    RunStatus,
    Snapshot,
    TextPart,
    ThreadView,
    ToolCallPart,
    ToolState,
    Waiting,
    WaitKind,
    check_run_transition,
    check_tool_transition,
    pending_actions_of,
)
from runtime.errors import IllegalTransition
from server.protocol.wire_errors import STATUS

LEGAL_RUN = {
    (RunStatus.QUEUED, RunStatus.RUNNING),
    (RunStatus.QUEUED, RunStatus.CANCELLED),
    (RunStatus.QUEUED, RunStatus.FAILED),
    (RunStatus.RUNNING, RunStatus.WAITING),
    (RunStatus.RUNNING, RunStatus.COMPLETED),
    (RunStatus.RUNNING, RunStatus.FAILED),
    (RunStatus.RUNNING, RunStatus.CANCELLED),
    (RunStatus.WAITING, RunStatus.RUNNING),
    (RunStatus.WAITING, RunStatus.CANCELLED),
    (RunStatus.WAITING, RunStatus.FAILED),
}
FINAL_TOOL = {
    ToolState.OUTPUT_AVAILABLE,
    ToolState.OUTPUT_ERROR,
    ToolState.SKIPPED,
    ToolState.REJECTED,
    ToolState.CANCELLED,
}


# --- runs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("current", "target"), sorted(LEGAL_RUN))
def test_legal_run_transitions_pass(current: RunStatus, target: RunStatus) -> None:
    check_run_transition(current, target)


@pytest.mark.parametrize(
    ("current", "target"),
    [pair for pair in itertools.product(RunStatus, RunStatus) if pair not in LEGAL_RUN],
)
def test_illegal_run_transitions_raise(current: RunStatus, target: RunStatus) -> None:
    with pytest.raises(IllegalTransition) as caught:
        check_run_transition(current, target)
    # HTTP statuses moved from runtime's errors to the server's table.
    assert caught.value.code == "illegal_transition" and STATUS[caught.value.code] == 409


def test_run_status_terminal_and_active() -> None:
    terminal = {s for s in RunStatus if s.is_terminal}
    assert terminal == {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED}
    assert all(s.is_active is not s.is_terminal for s in RunStatus)


# --- tool parts ---------------------------------------------------------------------------


def waiting(action_id: str = "a1", resolved: bool = False) -> Waiting:
    return Waiting(
        action_id=action_id,
        kind=WaitKind.APPROVAL,
        payload_schema={"type": "object"},
        allowed_roles=(Role.USER,),
        resolution=Resolution(subject="bob", role=Role.USER, payload={}, at=1.0)
        if resolved
        else None,
    )


def test_final_tool_states() -> None:
    assert {s for s in ToolState if s.is_final} == FINAL_TOOL


@pytest.mark.parametrize("final", sorted(FINAL_TOOL))
def test_final_tool_states_are_dead_ends(final: ToolState) -> None:
    for target in ToolState:
        with pytest.raises(IllegalTransition):
            check_tool_transition(final, target)


def test_tool_transition_table() -> None:
    check_tool_transition(ToolState.INPUT_AVAILABLE, ToolState.AWAITING_ACTION)
    check_tool_transition(ToolState.INPUT_AVAILABLE, ToolState.RUNNING)
    check_tool_transition(ToolState.AWAITING_ACTION, ToolState.RUNNING)
    check_tool_transition(ToolState.AWAITING_ACTION, ToolState.REJECTED)
    check_tool_transition(ToolState.RUNNING, ToolState.OUTPUT_AVAILABLE)
    for current, target in [
        (ToolState.RUNNING, ToolState.AWAITING_ACTION),
        (ToolState.RUNNING, ToolState.SKIPPED),
        (ToolState.RUNNING, ToolState.RUNNING),
        (ToolState.AWAITING_ACTION, ToolState.INPUT_AVAILABLE),
        (ToolState.INPUT_AVAILABLE, ToolState.INPUT_AVAILABLE),
    ]:
        with pytest.raises(IllegalTransition):
            check_tool_transition(current, target)


def test_part_transition_returns_a_copy_or_raises() -> None:
    part = ToolCallPart(tool_call_id="c1", name="lookup", input={"q": 1})
    running = part.transition(ToolState.RUNNING)
    done = running.transition(ToolState.OUTPUT_AVAILABLE, output={"answer": 42})
    assert part.state is ToolState.INPUT_AVAILABLE  # frozen original unchanged
    assert (done.state, done.output, done.input) == (
        ToolState.OUTPUT_AVAILABLE,
        {"answer": 42},
        {"q": 1},
    )
    with pytest.raises(IllegalTransition):
        done.transition(ToolState.RUNNING)
    with pytest.raises(ValidationError):
        part.state = ToolState.RUNNING  # type: ignore[misc]


def test_is_pending_needs_an_unresolved_wait() -> None:
    part = ToolCallPart(tool_call_id="c1", name="send")
    suspended = part.transition(ToolState.AWAITING_ACTION, waiting=waiting())
    assert suspended.is_pending and not part.is_pending
    resolved = suspended.model_copy(update={"waiting": waiting(resolved=True)})
    assert not resolved.is_pending
    assert not suspended.transition(ToolState.CANCELLED).is_pending


# --- the Part union -----------------------------------------------------------------------


def test_parts_parse_by_discriminator() -> None:
    parts = PartsAdapter.validate_python(
        [
            {"type": "text", "text": "hi"},
            {"type": "tool-call", "tool_call_id": "c1", "name": "n", "state": "running"},
        ]
    )
    assert isinstance(parts[0], TextPart) and isinstance(parts[1], ToolCallPart)
    assert parts[1].state is ToolState.RUNNING


@pytest.mark.parametrize(
    "raw",
    [
        {"type": "image", "url": "x"},
        {"text": "no discriminator"},
        {"type": "text"},
        {"type": "text", "text": "hi", "extra": 1},
        {"type": "tool-call", "tool_call_id": "", "name": "n"},
        {"type": "tool-call", "tool_call_id": "c", "name": "n", "state": "sleeping"},
        {"type": "text", "text": "x" * (MAX_TEXT_CHARS + 1)},
    ],
)
def test_malformed_parts_are_rejected(raw: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        PartsAdapter.validate_python([raw])


def test_parts_round_trip_json_with_schema_alias() -> None:
    part = ToolCallPart(
        tool_call_id="c1", name="send", state=ToolState.AWAITING_ACTION, waiting=waiting()
    )
    dumped = PartsAdapter.dump_json([part], by_alias=True)
    assert b'"schema"' in dumped
    assert PartsAdapter.validate_json(dumped) == [part]


# --- projections --------------------------------------------------------------------------


def test_pending_actions_of_projects_only_unresolved_waits() -> None:
    pending = ToolCallPart(
        tool_call_id="c1",
        name="send",
        input={"to": "x"},
        state=ToolState.AWAITING_ACTION,
        waiting=waiting("a1"),
    )
    resolved = pending.model_copy(
        update={"tool_call_id": "c2", "waiting": waiting("a2", resolved=True)}
    )
    message = Message(
        id="m1",
        thread_id="t1",
        position=3,
        role=MessageRole.ASSISTANT,
        parts=(TextPart(text="hm"), pending, resolved),
        run_id="r1",
        created_at=0.0,
        updated_at=0.0,
    )
    [action] = pending_actions_of(message)
    assert (action.id, action.run_id, action.message_id, action.tool_call_id) == (
        "a1",
        "r1",
        "m1",
        "c1",
    )
    assert action.input == {"to": "x"} and action.allowed_roles == (Role.USER,)
    snapshot = Snapshot(
        thread=ThreadView(id="t1", scope="s", title="", version=4, metadata={}),
        messages=(),
        pending_actions=(action,),
        run=None,
        queue=(),
    )
    assert snapshot.to_wire()["pending_actions"][0]["schema"] == {"type": "object"}
